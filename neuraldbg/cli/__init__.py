"""The ``neuraldbg`` command line.

``main()`` only builds the top-level parser and dispatches: each subcommand registers its
own parser with :func:`command` (``explain``, ``report``, ``tune-priors``, ``check-priors``
and ``tune-verification``).
Errors in the user's input or environment (a missing or unreadable file, a bad session or
prior file: ``OSError``, ``ValueError``) print one line on stderr, ``neuraldbg: error: ...``,
and exit with status 1 (``--debug`` adds the traceback); usage errors exit with status 2
(argparse, whose message has the same ``neuraldbg: error:`` head). Any other exception is a
bug of ours: its traceback is shown with a line asking for a report, and the status is 70.
A reader that closes the pipe early (``neuraldbg explain run.json | head``) ends the command
quietly, with the status of a process killed by SIGPIPE (141), as other Unix tools do.
``--debug`` and ``--verbose`` are accepted before or after the subcommand. A file written
into a folder that does not exist creates it, and the command says so (``docs/api.md``).

This package holds the dispatch, the error handling and the registry; the subcommands live
in one module each: :mod:`.explain`, :mod:`.report` and :mod:`.tune_priors` here (with
:mod:`.sessions`, the session and prior loading the first two share), ``check-priors`` in
:mod:`neuraldbg.fit.check` and ``tune-verification`` in :mod:`neuraldbg.verify.tune`.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from typing import Any, Callable, Sequence

log = logging.getLogger("neuraldbg")

#: subcommand name -> function adding its parser to the subparsers object
COMMANDS: dict[str, Callable[[Any], argparse.ArgumentParser]] = {}


ParserFn = Callable[[Any], argparse.ArgumentParser]


def command(name: str) -> Callable[[ParserFn], ParserFn]:
    """Register ``fn(subparsers) -> parser`` as subcommand ``name``; the parser must set
    ``func`` (via ``set_defaults``) to the callable that runs it and returns an exit code."""
    def deco(fn):
        COMMANDS[name] = fn
        return fn
    return deco


class UserError(Exception):
    """An error message for the user (no traceback)."""


def wrote(path: str, created: Sequence[str] = ()) -> str:
    """The line a command prints for a file it wrote, naming the folders it had to create."""
    if not created:
        return f"Wrote {path}"
    return f"Wrote {path} (created the folder{'s' if len(created) > 1 else ''} {', '.join(created)})"


def fail(exc: BaseException, args: Any) -> int:
    """Report a user-facing error as one line (plus its traceback under ``--debug``); 1."""
    if getattr(args, "debug", False):
        traceback.print_exception(exc)
    text = " ".join(str(exc).split("\n")).strip() or type(exc).__name__
    print(f"neuraldbg: error: {text}", file=sys.stderr)
    return 1


# ---- subcommands --------------------------------------------------------------------------

#: subcommand name -> the module whose ``add_parser(subparsers)`` adds its parser. Each module is
#: imported only when the parser is built: importing the command line (or ``neuraldbg``) then
#: loads none of the engines behind the subcommands.
SUBCOMMANDS: dict[str, str] = {
    "explain": "neuraldbg.cli.explain",
    "report": "neuraldbg.cli.report",
    "tune-priors": "neuraldbg.cli.tune_priors",
    "check-priors": "neuraldbg.fit.check",
    "tune-verification": "neuraldbg.verify.tune",
}


def _lazy_parser(module: str) -> ParserFn:
    def add_parser(sub: Any) -> argparse.ArgumentParser:
        return importlib.import_module(module).add_parser(sub)
    return add_parser


for _name, _module in SUBCOMMANDS.items():
    command(_name)(_lazy_parser(_module))


# ---- entry point --------------------------------------------------------------------------

def _log_to_stderr(level: int) -> None:
    """Show the ``neuraldbg`` logger on stderr; the root logger is the application's, not ours."""
    if not any(getattr(h, "_neuraldbg_cli", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
        handler._neuraldbg_cli = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(level)


class Parser(argparse.ArgumentParser):
    """argparse's parser with one error head for every subcommand: ``neuraldbg: error: ...``
    (a subparser would say ``neuraldbg explain: error: ...``); usage errors keep status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"neuraldbg: error: {message}\n")


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """``--verbose`` and ``--debug``: on the top-level parser (``default`` False) and again on
    each subcommand's (``default`` SUPPRESS, so that a flag given before the subcommand is not
    reset by the subparser's default)."""
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="log debug messages")
    parser.add_argument("--debug", action="store_true", default=default, help="show the traceback of an error")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per registered command."""
    from neuraldbg import __version__

    parser = Parser(prog="neuraldbg", description="Tells you why a PyTorch training run failed.")
    parser.add_argument("--version", action="version", version=f"neuraldbg {__version__}")
    _global_options(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in sorted(COMMANDS):
        _global_options(COMMANDS[name](sub), argparse.SUPPRESS)
    return parser


#: exit status of an error that is a bug of ours, not of the input (sysexits' EX_SOFTWARE)
EXIT_BUG = 70
#: exit status when the reader of stdout went away: that of a process killed by SIGPIPE
EXIT_PIPE = 128 + 13


def _pipe_closed() -> int:
    """The reader closed stdout (``| head``): nothing to report. stdout is pointed at
    ``/dev/null`` so that the interpreter's final flush does not fail again on exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured): nothing to flush
        pass
    return EXIT_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: parse, dispatch to the subcommand, return its exit status.

    Errors in the input or environment are one line on stderr and status 1; anything else
    is a bug of ours: its traceback, a line asking for a report, status :data:`EXIT_BUG`.
    """
    args = build_parser().parse_args(argv)
    _log_to_stderr(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return status
    except BrokenPipeError:
        return _pipe_closed()
    except (UserError, OSError, ValueError) as exc:  # json.JSONDecodeError and SchemaError are ValueErrors
        return fail(exc, args)
    except KeyboardInterrupt:
        return 130
    except Exception:  # noqa: BLE001 - not the user's fault: show everything
        traceback.print_exc()
        print("neuraldbg: internal error: this is a bug in NeuralDBG, not in your input; please report it "
              "with the traceback above and the command you ran", file=sys.stderr)
        return EXIT_BUG
