"""``neuraldbg report``: one self-contained HTML page of a session, or of the merged
sessions of a distributed job (:func:`neuraldbg.report.html.write_report`)."""
from __future__ import annotations

import argparse
from typing import Any

from neuraldbg.cli import UserError, wrote
from neuraldbg.cli.sessions import load, merged, priors_for


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``neuraldbg report`` subcommand (registered by ``neuraldbg/cli/__init__.py``)."""
    p = sub.add_parser(
        "report", help="write a self-contained HTML report of a session",
        description="Write one HTML page (inline SVG, no network) with the loss curve and its events, "
                    "the layer-by-step event map, the posterior, the hypotheses with their fixes and the "
                    "causal chain, and what the diagnosis did not observe. Several sessions (one per rank of "
                    "a distributed job) are merged first; the event map then has one facet per rank.")
    p.add_argument("sessions", nargs="+", metavar="SESSION.json", help="exported session file(s)")
    p.add_argument("-o", "--output", default="report.html", metavar="FILE",
                   help="HTML file to write (default report.html)")
    p.add_argument("--priors", metavar="FILE", default=None,
                   help="tuned prior file (default: the one recorded in the session, else the family's)")
    p.add_argument("--family", default=None, help="use this family's shipped priors instead of the session's")
    p.add_argument("--title", default=None, help="page title (default: family and steps)")
    p.set_defaults(func=run_report)
    return p


def run_report(args: argparse.Namespace) -> int:
    """Write the report; 0 on success, 1 when a session, prior file or the output is unusable."""
    from neuraldbg.jsonio import new_folders
    from neuraldbg.report.html import write_report

    session = merged(args.sessions) if len(args.sessions) > 1 else load(args.sessions[0])
    priors, _ = priors_for(session, args)
    created = new_folders(args.output)
    try:
        path = write_report(session, args.output, priors=priors, title=args.title)
    except OSError as exc:
        raise UserError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    print(wrote(path, created))
    return 0
