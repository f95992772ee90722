"""Tune the interventional likelihoods to benchmark runs made with ``--verify``.

``neuraldbg tune-verification --runs DIR [DIR2 ...] [--out FILE] [--ess N]`` reads
``DIR/records/*.json``: each record names its family, its true cause (the injection's) and
every test its verification ran, with the outcome. For every (tested state, true label) the
fitted probability is the posterior mean of a Beta prior centred on the hand-set value with
``ess`` pseudo-runs, updated with the counts over all families (``default``); each family's
table is then the same update of ``default`` with that family's own counts. A cell without
runs keeps its prior. Untestable tests carry no outcome and are not counted. The file keeps
the hand-set table, the counts, the outcome rule and the provenance next to the fitted tables;
records whose tests were decided by an earlier rule (no ``symptoms`` count) are refused.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

from neuraldbg.jsonio import decode_nonfinite, write_json_atomic
from neuraldbg.verify import likelihoods as L
from neuraldbg.verify import outcome as O
from neuraldbg.vocab import HEALTHY, LABELS

#: Pseudo-runs of the Beta prior around each cell's hand-set (or ``default``) value.
DEFAULT_ESS = 4.0
#: Probabilities are kept inside (CLIP, 1 - CLIP): one outcome never makes a cause impossible.
CLIP = 0.01

Case = tuple[str, str, str, str]  # family, tested label, true label, outcome


def _text(v: Any) -> str:
    """A record's text cell: missing (``None``, NaN from a table) reads as empty."""
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def cases_from_records(records: Iterable[Mapping[str, Any]]) -> list[Case]:
    """``(family, test, truth, outcome)`` of every replayed test in benchmark records (files
    or table rows)."""
    out = []
    for rec in records:
        tests = _text(rec.get("verify_tests"))
        if not tests.startswith("[") or _text(rec.get("error")):
            continue
        cause = _text(rec.get("true_cause"))
        truth = f"{cause}/{_text(rec.get('true_state'))}" if cause else HEALTHY
        if truth not in LABELS:
            continue
        for t in json.loads(tests):
            if t.get("outcome") not in O.OUTCOMES:  # untestable: no outcome to count
                continue
            if "symptoms" not in t:
                raise ValueError(f"{rec.get('key') or rec.get('arch')}: its verification was decided by an earlier "
                                 f"outcome rule (loss only); rerun it with `python -m benchmarks run --verify`")
            out.append((str(rec.get("family")), f"{t['cause']}/{t['state']}", truth, t["outcome"]))
    return out


def read_records(dirs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every ``records/*.json`` of the benchmark folders ``dirs``."""
    recs = []
    for d in dirs:
        paths = sorted((Path(d) / "records").glob("*.json"))
        if not paths:
            raise FileNotFoundError(f"no records in {d}: expected {Path(d) / 'records'}/*.json")
        recs += [decode_nonfinite(json.loads(p.read_text())) for p in paths]
    return recs


def _update(prior: Mapping[str, Mapping[str, float]], counts: Mapping[tuple[str, str], list[int]],
            ess: float) -> dict[str, dict[str, float]]:
    out = {}
    for test, row in prior.items():
        out[test] = {}
        for lab, p0 in row.items():
            k, n = counts.get((test, lab), (0, 0))
            p = (k + ess * p0) / (n + ess)
            out[test][lab] = min(1 - CLIP, max(CLIP, p))
    return out


def fit_tables(cases: Iterable[Case], hand_set: Mapping[str, Mapping[str, float]], ess: float = DEFAULT_ESS
               ) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, dict[str, list[int]]]]]:
    """``(fitted tables by family and 'default', counts [vanished, runs] by family)``."""
    if not ess > 0:
        raise ValueError(f"ess must be > 0, got {ess!r}")
    by_fam: dict[str, dict[tuple[str, str], list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for fam, test, truth, outcome in cases:
        for key in (fam, "default"):
            c = by_fam[key][(test, truth)]
            c[0] += outcome == "vanished"
            c[1] += 1
    default = _update(hand_set, by_fam.get("default", {}), ess)
    tables = {"default": default}
    for fam, counts in by_fam.items():
        if fam != "default":
            tables[fam] = _update(default, counts, ess)
    plain = {fam: {f"{t}|{lab}": v for (t, lab), v in c.items()} for fam, c in by_fam.items()}
    return tables, plain


def fit_file(dirs: Iterable[str | Path], ess: float = DEFAULT_ESS, base: Mapping[str, Any] | None = None
             ) -> dict[str, Any]:
    """The likelihood file fitted to the runs in ``dirs`` (``base``: the file whose hand-set
    table is the prior; the shipped one by default)."""
    dirs = [str(d) for d in dirs]
    base = dict(L.load() if base is None else base)
    cases = cases_from_records(read_records(dirs))
    if not cases:
        raise ValueError(f"no verification outcomes in {', '.join(dirs)}: run `python -m benchmarks run --verify`")
    tables, counts = fit_tables(cases, base["hand_set"], ess)
    outcome = {**(base.get("outcome") or {}), "vanished_improvement": O.VANISHED_IMPROVEMENT, "rule": O.RULE}
    base.update(fitted=tables, counts=counts, outcome=outcome, provenance={
        "method": "Beta-smoothed counts of benchmark verifications (neuraldbg/verify/tune.py)",
        "runs": dirs, "tests": len(cases), "ess": ess, "date": time.strftime("%Y-%m-%d")})
    return L.validate(base, "fitted")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``neuraldbg tune-verification`` subcommand (registered by ``neuraldbg/cli/__init__.py``)."""
    p = sub.add_parser(
        "tune-verification", help="fit the verification likelihoods to benchmark runs made with --verify",
        description=__doc__.split("\n\n")[0] + " See docs/verification.md.")
    p.add_argument("--runs", nargs="+", required=True, metavar="DIR", help="benchmark folders run with --verify")
    p.add_argument("--out", default=str(L.shipped_path()), metavar="FILE",
                   help="where to write (default: the shipped file)")
    p.add_argument("--ess", type=float, default=DEFAULT_ESS,
                   help="pseudo-runs of each cell's prior (default %(default)s)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Fit and write the likelihood file; a bad folder or record raises ``ValueError`` /
    ``FileNotFoundError``, which the command line reports as one line."""
    from neuraldbg.jsonio import new_folders

    data = fit_file(args.runs, args.ess)
    created = new_folders(args.out)
    write_json_atomic(args.out, data)
    made = f" (created {', '.join(created)})" if created else ""
    print(f"{data['provenance']['tests']} tests from {len(args.runs)} folder(s) -> {args.out}{made}")
    return 0
