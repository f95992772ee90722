"""``neuraldbg explain``: the verdict, ranked hypotheses, causal chains, coverage and
posterior of sessions written by ``dbg.save_session(path)``, as text or JSON (offline: from
the files alone)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from neuraldbg.cli import UserError, fail
from neuraldbg.cli.sessions import load, merged, priors_for


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``neuraldbg explain`` subcommand (registered by ``neuraldbg/cli/__init__.py``)."""
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


def _report(path: str, args: argparse.Namespace, session: Any = None) -> dict[str, Any]:
    from neuraldbg.causal import api
    from neuraldbg.causal.hypotheses import REPORT_FLOOR, failure_observed
    from neuraldbg.events.base import FAILURE_TYPES

    session = load(path) if session is None else session
    trace = session.trace()
    priors, source = priors_for(session, args)
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
            jobs = [(" + ".join(args.sessions), merged(args.sessions))]
        except UserError as exc:
            return fail(exc, args)
    for i, (path, preloaded) in enumerate(jobs):
        try:
            rep = _report(path, args, preloaded)
        except BrokenPipeError:
            raise
        except (UserError, OSError, ValueError) as exc:  # one line per unusable session, then go on
            status = fail(exc, args)
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
