"""The session and prior files a command was given, read with errors for the user.

Shared by ``explain`` and ``report``: a file that cannot be read, a bad session or prior file,
or sessions that cannot be merged raise :class:`~neuraldbg.cli.UserError` with one line.
"""
from __future__ import annotations

import argparse
from typing import Any, Sequence

from neuraldbg.cli import UserError


def load(path: str) -> Any:
    """The session at ``path``; an unreadable or invalid file is a :class:`UserError`."""
    from neuraldbg.session import load_session

    try:
        return load_session(path)
    except OSError as exc:
        raise UserError(str(exc) if exc.strerror is None else f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None


def priors_for(session: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """(priors for the engine, human-readable source): ``--priors``, ``--family``, else the
    priors embedded in the session. A session never makes us open a path it names."""
    from neuraldbg.causal.priors import PriorError, load_priors
    from neuraldbg.vocab import FAMILIES

    try:
        if args.priors:
            return load_priors(path=args.priors), args.priors
        if args.family:
            if args.family not in FAMILIES:
                raise UserError(f"unknown family {args.family!r}; valid: {', '.join(FAMILIES)}")
            return load_priors(family=args.family), f"{args.family} (shipped)"
        pri = session.priors
    except PriorError as exc:
        raise UserError(str(exc)) from None
    shipped = getattr(session, "_priors", None) is None  # no embedded priors: a version-1 session
    return pri, f"{pri.family} (shipped)" if shipped else pri.source


def merged(paths: Sequence[str]) -> Any:
    """The sessions at ``paths`` (one per rank) merged into one; a :class:`UserError` otherwise."""
    from neuraldbg.distributed import merge_sessions

    sessions = [load(p) for p in paths]
    try:
        return merge_sessions(sessions)
    except (TypeError, ValueError) as exc:
        raise UserError(f"cannot merge {', '.join(paths)}: {exc}") from None

