"""Whether the prior files were fitted on what this code records.

A fitted prior file names its training cases in its provenance (``fitted_on``: their seeds,
architectures and injections, and the hash of their keys, truths and evidence,
:func:`~neuraldbg.fit.cases.inputs_hash`). :func:`check_priors` selects the same cases from a
benchmark folder recorded by this checkout and hashes them again: an equal hash means the file
was fitted on exactly the evidence this code records; a different one means a detector, a
signature or an extractor has changed since the fit, and the file describes the old code.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from neuraldbg.fit.cases import Run, inputs_hash, load_runs, other_code
from neuraldbg.source import code_version
from neuraldbg.vocab import FAMILIES, validate_family

#: the statuses of :class:`PriorCheck`
CURRENT, STALE, HAND_SET, MISSING = "current", "stale", "hand-set", "runs missing"


@dataclass(frozen=True)
class PriorCheck:
    """One family's prior file against a benchmark folder."""

    family: str
    status: str   # CURRENT, STALE, HAND_SET (nothing was fitted) or MISSING (the folder lacks runs)
    fitted: int   # training cases the file names (0 when hand-set)
    found: int    # of those, found in the folder
    detail: str

    @property
    def ok(self) -> bool:
        """Whether nothing needs refitting (current, or hand-set)."""
        return self.status in (CURRENT, HAND_SET)


def check_family(family: str, priors, runs: Iterable[Run]) -> PriorCheck:
    """``priors`` (a :class:`~neuraldbg.causal.priors.Priors`) against the runs of ``family``
    among ``runs``, selected as its provenance says."""
    prov = priors.provenance
    if prov.get("method") != "fitted":
        return PriorCheck(family, HAND_SET, 0, 0, "hand-set tables: nothing was fitted")
    fo = prov.get("fitted_on") or {}
    seeds, archs, injs = (set(fo.get(k) or ()) for k in ("seeds", "architectures", "injections"))
    sel = [r for r in runs if r.family == family and r.seed in seeds and r.arch in archs and r.injection in injs]
    n = int(fo.get("records", 0))
    if len(sel) != n:
        return PriorCheck(family, MISSING, n, len(sel),
                          f"fitted on {n} runs (seeds {sorted(seeds)}), {len(sel)} of those here: run the "
                          "benchmark the file was fitted on (python -m benchmarks run, all seeds) into this folder")
    got = inputs_hash(sel)
    if got != fo.get("sha256"):
        return PriorCheck(family, STALE, n, len(sel),
                          f"the evidence of its {n} runs has changed since the fit ({str(fo.get('sha256'))[:12]} "
                          f"then, {got[:12]} now): refit it (make priors)")
    return PriorCheck(family, CURRENT, n, len(sel), f"fitted on exactly the evidence of these {n} runs")


def check_priors(runs: str | os.PathLike | Iterable[Run], families: Iterable[str] | None = None,
                 priors: Mapping[str, object] | None = None) -> list[PriorCheck]:
    """Each family's prior file (default: the shipped ones; ``priors`` maps a family to a
    ``Priors``) checked against a benchmark folder (or runs) recorded by this checkout: whether
    it was fitted on exactly the evidence this code records (:func:`check_family`)."""
    from neuraldbg.causal.priors import load_priors

    fams = list(FAMILIES) if families is None else [validate_family(f) for f in families]
    all_runs = load_runs(runs)
    out = []
    for f in fams:
        pri = priors[f] if priors is not None and f in priors else load_priors(f)
        out.append(check_family(f, pri, all_runs))
    return out


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``neuraldbg check-priors`` subcommand (registered by ``neuraldbg/cli/__init__.py``)."""
    p = sub.add_parser(
        "check-priors", help="check that the prior files were fitted on what this code records",
        description="Select each fitted prior file's training cases (its provenance) from a benchmark folder "
                    "recorded by this checkout and compare their hash with the one the file recorded: "
                    "'stale' means the evidence has changed since the fit. Exit status 1 unless every "
                    "file is current or hand-set. See docs/priors.md.")
    p.add_argument("--runs", required=True, metavar="DIR", help="benchmark output folder (python -m benchmarks run)")
    p.add_argument("--family", nargs="+", metavar="NAME", default=None, help="families to check (default: all)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print one line per family; 1 when a file is stale, its runs are missing from the folder,
    or the folder was recorded by other code. An unusable folder or an unknown family raises
    ``ValueError``, which the command line reports as one line."""
    runs = load_runs(args.runs)
    checks = check_priors(runs, args.family)
    others = other_code(runs)
    if others:
        print(f"note: some runs in {args.runs} were recorded by other code ({', '.join(others)}) than this "
              f"checkout's ({code_version()}); run the benchmark into it again first")
    unknown = sum(r.code is None for r in runs)
    if unknown:
        print(f"note: {unknown} run(s) in {args.runs} do not say which code recorded them (no 'code' column)")
    for c in checks:
        print(f"{c.family:12s} {c.status:13s} {c.detail}")
    return 0 if all(c.ok for c in checks) and not others else 1
