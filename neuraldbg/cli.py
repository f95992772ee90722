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
"""
from __future__ import annotations

import argparse
import json
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


# ---- explain ------------------------------------------------------------------------------

@command("explain")
def _explain_parser(sub: Any) -> argparse.ArgumentParser:
    from neuraldbg.events.base import FAILURE_TYPES

    p = sub.add_parser(
        "explain", help="rank the root causes of an exported session (offline)",
        description="Print the verdict, ranked hypotheses, causal chains, what was not observed (and why) "
                    "and the posterior of one or more sessions written by dbg.save_session(path).")
    p.add_argument("sessions", nargs="+", metavar="SESSION.json", help="exported session file(s)")
    p.add_argument("-f", "--failure-type", choices=list(FAILURE_TYPES), default=None,
                   help="only hypotheses explaining this failure type, and its chain")
    p.add_argument("--priors", metavar="FILE", default=None,
                   help="tuned prior file to use instead of the priors embedded in the session")
    p.add_argument("--family", default=None, help="use this family's shipped priors instead of the session's")
    p.add_argument("--floor", type=float, default=None,
                   help="reporting floor on the posterior (default: the engine's, 0.2)")
    p.add_argument("--couplings", action="store_true", help="also list coupled failures")
    p.add_argument("--evidence", action="store_true", help="also print the discretized evidence")
    p.add_argument("--json", action="store_true", help="one JSON document per session on stdout")
    p.add_argument("--merge", action="store_true",
                   help="merge the sessions (one per rank of a distributed job) and explain them as one")
    p.set_defaults(func=run_explain)
    return p


def _load(path: str) -> Any:
    from neuraldbg.session import load_session

    try:
        return load_session(path)
    except OSError as exc:
        raise UserError(str(exc) if exc.strerror is None else f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _priors_for(session: Any, args: argparse.Namespace) -> tuple[Any, str]:
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


def _merged(paths: Sequence[str]) -> Any:
    from neuraldbg.distributed import merge_sessions

    sessions = [_load(p) for p in paths]
    try:
        return merge_sessions(sessions)
    except (TypeError, ValueError) as exc:
        raise UserError(f"cannot merge {', '.join(paths)}: {exc}") from None


def _report(path: str, args: argparse.Namespace, session: Any = None) -> dict[str, Any]:
    from neuraldbg.causal import api
    from neuraldbg.causal.hypotheses import REPORT_FLOOR, failure_observed
    from neuraldbg.events.base import FAILURE_TYPES

    session = _load(path) if session is None else session
    trace = session.trace()
    priors, source = _priors_for(session, args)
    floor = REPORT_FLOOR if args.floor is None else args.floor
    if not 0 <= floor <= 1:
        raise UserError(f"--floor must be within [0, 1], got {floor}")
    post = api.posterior(trace, priors)
    if args.failure_type:
        hyps = api.explain(trace, args.failure_type, priors, floor=floor)
        types = [args.failure_type]
    else:
        hyps = api.hypotheses(trace, priors, floor=floor)
        ev = api.evidence(trace)
        types = [ft for ft in FAILURE_TYPES if failure_observed(trace, ev, ft)]
    chains = [api.causal_chain(trace, ft, priors) for ft in types]
    cov = api.coverage(trace)
    out: dict[str, Any] = {
        "session": path, "family": trace.family, "priors": source,
        "steps": [trace.first_step, trace.last_step], "n_events": len(trace.events),
        # no verdict when nothing was observed: p_healthy is then the prior's (docs/api.md)
        "floor": floor, "p_healthy": post.p_healthy, "nothing_observed": post.nothing_observed,
        "healthy": None if post.nothing_observed else post.is_healthy,
        "hypotheses": [h.to_dict() for h in hyps],
        "chains": [c.to_dict() for c in chains],
        "posterior": {k: v for k, v in post.items() if k != "healthy"},
        "coverage": cov.to_dict(),
        "_objects": (hyps, chains, post),
        "_coverage": cov,
    }
    if args.couplings:
        cps = api.couplings(trace)
        out["couplings"] = [c.to_dict() for c in cps]
        out["_objects"] += (cps,)
    if args.evidence:
        ev = api.evidence(trace)
        out["evidence"] = {k: (v if isinstance(v, str) else list(v)) for k, v in ev.observed.items()}
        out["evidence_notes"] = dict(ev.notes)
    return out


def _print_text(rep: dict[str, Any], args: argparse.Namespace, stream) -> None:
    from neuraldbg.report import coverage as coverage_text

    hyps, chains, post = rep["_objects"][:3]
    w = stream.write
    w(f"Session {rep['session']}: family {rep['family']}, steps {rep['steps'][0]}-{rep['steps'][1]}, "
      f"{rep['n_events']} events, priors {rep['priors']}\n")
    w(coverage_text.verdict(post) + "\n")  # the one verdict, P(healthy) >= 0.5, or none (docs/api.md)
    scope = f" explaining {args.failure_type}" if args.failure_type else ""
    if post.nothing_observed:
        pass  # no hypothesis either: the verdict line says why
    elif hyps:
        w(f"Hypotheses{scope} (posterior >= {rep['floor']:.2f}):\n")
        for i, h in enumerate(hyps, 1):
            w(f"  {i}. {h.description}\n     fix: {h.suggested_fix}\n")
            for e in h.evidence[:5]:
                w(f"     - {e}\n")
            if len(h.evidence) > 5:
                w(f"     - ... {len(h.evidence) - 5} more events\n")
    else:
        w(f"No hypothesis{scope} above the reporting floor ({rep['floor']:.2f}).\n")
    if chains:
        w("Causal chains:\n")
        for c in chains:
            w(f"  {c}\n")
    for line in coverage_text.text_lines(rep["_coverage"]):
        w(line + "\n")
    w("Prior (nothing observed):\n" if post.nothing_observed else "Posterior:\n")
    for var, dist in rep["posterior"].items():
        w(f"  {var:15s} " + "  ".join(f"{s} {p:.3f}" for s, p in dist.items()) + "\n")
    if "couplings" in rep:
        cps = rep["_objects"][3]
        w("Coupled failures:\n" if cps else "No coupled failures.\n")
        for c in cps:
            w(f"  {c}\n")
    if "evidence" in rep:
        w("Evidence:\n")
        for var, state in rep["evidence"].items():
            note = rep["evidence_notes"].get(var, "")
            w(f"  {var:13s} {state if isinstance(state, str) else '|'.join(state):16s} {note}\n")


def run_explain(args: argparse.Namespace) -> int:
    """Explain each session; 0 on success, 1 when a session or prior file is unusable."""
    status = 0
    docs = []
    jobs: list[tuple[str, Any]] = [(p, None) for p in args.sessions]
    if args.merge:
        try:
            jobs = [(" + ".join(args.sessions), _merged(args.sessions))]
        except UserError as exc:
            return _fail(exc, args)
    for i, (path, preloaded) in enumerate(jobs):
        try:
            rep = _report(path, args, preloaded)
        except BrokenPipeError:
            raise
        except (UserError, OSError, ValueError) as exc:  # one line per unusable session, then go on
            status = _fail(exc, args)
            continue
        if args.json:
            docs.append({k: v for k, v in rep.items() if not k.startswith("_")})
        else:
            if i:
                sys.stdout.write("\n")
            _print_text(rep, args, sys.stdout)
    if args.json:
        json.dump(docs[0] if len(docs) == 1 else docs, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    return status


# ---- tune-priors --------------------------------------------------------------------------

@command("tune-priors")
def _tune_parser(sub: Any) -> argparse.ArgumentParser:
    from neuraldbg.fit import DEFAULT_ESS, DEFAULT_FOLDS

    p = sub.add_parser(
        "tune-priors", help="fit a family's prior file to benchmark runs",
        description="Fit the causal network's CPDs of one family to the runs of a benchmark output "
                    "directory (records.csv + sessions/), check hand-set vs fitted on held-out folds "
                    "(by seed), and write a prior file usable as NeuralDbg(priors=FILE). See docs/priors.md.")
    p.add_argument("--family", required=True, help="architecture family to fit (mlp, cnn, ...)")
    p.add_argument("--runs", required=True, metavar="DIR", help="benchmark output directory")
    p.add_argument("--out", required=True, metavar="FILE", help="prior file to write (JSON)")
    p.add_argument("--ess", type=float, default=DEFAULT_ESS,
                   help=f"equivalent sample size of the hand-set tables, per parent configuration "
                        f"(default {DEFAULT_ESS:g})")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS,
                   help=f"held-out folds, grouped by seed; 0 skips the check and the temperature "
                        f"(default {DEFAULT_FOLDS})")
    p.add_argument("--base", metavar="FILE", default=None,
                   help="prior file to start from and shrink toward (default: the family's shipped file)")
    p.add_argument("--no-temperature", action="store_true", help="keep temperature 1 instead of fitting it")
    p.add_argument("--temperature-criterion", choices=("prior_mix", "benchmark"), default="prior_mix",
                   help="held-out log loss the temperature minimizes: on the runs reweighted to the root "
                        "priors' label mix (default), or on the benchmark's own mix")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment (default 0)")
    p.add_argument("--allow-stale", action="store_true",
                   help="fit runs recorded by other code than this checkout's (refused by default: their "
                        "sessions hold the events the monitor recorded then)")
    p.set_defaults(func=run_tune)
    return p


def run_tune(args: argparse.Namespace) -> int:
    """Fit, write the prior file, print a summary; 1 when the runs or settings are unusable."""
    from neuraldbg.causal.priors import PriorError
    from neuraldbg.fit import TuneError, tune
    from neuraldbg.jsonio import new_folders
    from neuraldbg.vocab import FAMILIES

    if args.family not in FAMILIES:
        return _fail(UserError(f"unknown family {args.family!r}; valid: {', '.join(FAMILIES)}"), args)
    if args.folds == 1 or args.folds < 0:
        return _fail(UserError(f"--folds must be 0 or >= 2, got {args.folds}"), args)
    try:
        res = tune(args.runs, args.family, ess=args.ess, folds=args.folds, base=args.base,
                   temperature=not args.no_temperature, seed=args.seed,
                   criterion=args.temperature_criterion, allow_stale=args.allow_stale)
        created = new_folders(args.out)
        path = res.write(args.out)
    except (TuneError, PriorError, OSError) as exc:
        return _fail(exc, args)
    fo = res.data["provenance"]["fitted_on"]
    print(f"Fitted {args.family} on {fo['records']} runs ({len(fo['architectures'])} architectures, "
          f"seeds {fo['seeds']}): EM {res.fit.iterations} iterations, "
          f"train log-likelihood {res.fit.log_likelihood_start:.2f} -> {res.fit.log_likelihood:.2f}")
    if res.heldout:
        h = res.heldout
        print(f"Held-out ({h['folds']} folds by {h['grouping']}), temperature {res.data['temperature']:g}:")
        print(f"  {'':16s} {'log loss':>9s} {'Brier':>7s} {'ECE':>7s} {'top-1':>7s} {'mix log loss':>13s}")
        for name in ("hand_set", "fitted", "fitted_tempered"):
            m = h[name]
            print(f"  {name:16s} " + " ".join(f"{m[k]:{w}.3f}" if m.get(k) is not None else f"{'-':>{w}s}"
                                              for k, w in (("log_loss", 9), ("brier", 7), ("ece", 7), ("top1", 7),
                                                          ("mix_log_loss", 13))))
    else:
        print("No held-out check (--folds 0 or too few runs).")
    print(wrote(path, created))
    return 0


# ---- check-priors -------------------------------------------------------------------------

@command("check-priors")
def _check_priors_parser(sub: Any) -> argparse.ArgumentParser:
    from neuraldbg.fit.check import add_parser

    return add_parser(sub)


# ---- tune-verification --------------------------------------------------------------------

@command("tune-verification")
def _tune_verification_parser(sub: Any) -> argparse.ArgumentParser:
    from neuraldbg.verify.tune import add_parser

    return add_parser(sub)


# ---- report -------------------------------------------------------------------------------

@command("report")
def _report_parser(sub: Any) -> argparse.ArgumentParser:
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

    session = _merged(args.sessions) if len(args.sessions) > 1 else _load(args.sessions[0])
    priors, _ = _priors_for(session, args)
    created = new_folders(args.output)
    try:
        path = write_report(session, args.output, priors=priors, title=args.title)
    except OSError as exc:
        raise UserError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    print(wrote(path, created))
    return 0


# ---- entry point --------------------------------------------------------------------------

def wrote(path: str, created: Sequence[str] = ()) -> str:
    """The line a command prints for a file it wrote, naming the folders it had to create."""
    if not created:
        return f"Wrote {path}"
    return f"Wrote {path} (created the folder{'s' if len(created) > 1 else ''} {', '.join(created)})"


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


def _fail(exc: BaseException, args: Any) -> int:
    """Report a user-facing error as one line (plus its traceback under ``--debug``); 1."""
    if getattr(args, "debug", False):
        traceback.print_exception(exc)
    text = " ".join(str(exc).split("\n")).strip() or type(exc).__name__
    print(f"neuraldbg: error: {text}", file=sys.stderr)
    return 1


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
        return _fail(exc, args)
    except KeyboardInterrupt:
        return 130
    except Exception:  # noqa: BLE001 - not the user's fault: show everything
        traceback.print_exc()
        print("neuraldbg: internal error: this is a bug in NeuralDBG, not in your input; please report it "
              "with the traceback above and the command you ran", file=sys.stderr)
        return EXIT_BUG


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
