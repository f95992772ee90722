"""Training cases for the prior fitter: one :class:`Run` per benchmark run.

A case is the discretized evidence a run's trace produced
(:func:`neuraldbg.causal.evidence.extract`) and the root-cause states that were injected
(healthy runs: every root ``ok``). :func:`load_runs` reads them from a benchmark output
directory: ``records.csv`` (the truth of each run: ``arch``, ``family``, ``injection``,
``seed``, ``true_cause``, ``true_state``, optionally ``key``, ``session`` and ``error``; see
``docs/benchmark.md``) and the session each run exported. The estimators
(:mod:`neuraldbg.fit.em`, :mod:`neuraldbg.fit.select`) only ever see :class:`Run` objects.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from neuraldbg.source import code_version
from neuraldbg.vocab import HEALTHY, ROOT_NAMES, ROOTS

log = logging.getLogger("neuraldbg")

class TuneError(ValueError):
    """Runs or settings unusable for tuning (message says what and what is valid)."""


@dataclass(frozen=True)
class Run:
    """One training case: injected truth (every root) and the discretized evidence."""

    key: str
    family: str
    truth: Mapping[str, str]
    evidence: Mapping[str, str | tuple[str, ...]]
    arch: str = ""
    injection: str = ""
    seed: int = 0
    #: the hash of the code that recorded it (the record's ``code``; None when not known)
    code: str | None = None
    #: the ``(root, state)`` pairs the run lacks the preconditions of, ``("healthy", "yes")``
    #: when it cannot be healthy (:func:`neuraldbg.causal.api.impossible`): a prediction gives
    #: them probability 0, as the online diagnosis does; fitting reads the truth, not these
    ruled_out: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str | None:
        """``healthy``, ``variable/state`` for a single fault, ``None`` for several faults."""
        bad = [f"{v}/{s}" for v, s in self.truth.items() if s != "ok"]
        return HEALTHY if not bad else (bad[0] if len(bad) == 1 else None)


def truth_of(cause: Any, state: Any) -> dict[str, str]:
    """Full root assignment of a record's ``true_cause``/``true_state`` (empty: healthy)."""
    truth = {v: "ok" for v in ROOT_NAMES}
    if _empty(cause):
        return truth
    cause, state = str(cause), str(state)
    if cause not in ROOTS or state not in ROOTS[cause]:
        raise TuneError(f"truth {cause}={state} is not a state of the network; valid: "
                        + ", ".join(f"{v}={s}" for v, ss in ROOTS.items() for s in ss[1:]))
    truth[cause] = state
    return truth


def _empty(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v.strip() == "")


def _read_records(runs_dir: Path) -> list[dict[str, Any]]:
    import pandas as pd

    csv = runs_dir / "records.csv"
    if csv.is_file():
        df = pd.read_csv(csv, dtype={"code": str})  # a hash of digits only keeps its leading zeros
    elif (runs_dir / "records.parquet").is_file():
        df = pd.read_parquet(runs_dir / "records.parquet")
    else:
        raise TuneError(f"{runs_dir}: no records.csv (a benchmark output directory: "
                        "python -m benchmarks run --out DIR)")
    missing = {"arch", "family", "injection", "seed", "true_cause", "true_state"} - set(df.columns)
    if missing:
        raise TuneError(f"{csv}: records lack columns {sorted(missing)}")
    return df.to_dict("records")


def load_runs(source: str | os.PathLike | Iterable[Run], family: str | None = None) -> list[Run]:
    """Runs from a benchmark output directory (``records.csv`` + exported sessions) or an
    iterable of :class:`Run`; only ``family``'s when given. Errored runs and runs whose
    session file is missing are skipped with a warning (they carry no evidence)."""
    if not isinstance(source, (str, os.PathLike)):
        runs = [r if isinstance(r, Run) else Run(**{**r, "ruled_out": tuple(map(tuple, r.get("ruled_out", ())))})
                for r in source]
        return [r for r in runs if family is None or r.family == family]
    from neuraldbg.causal.api import impossible
    from neuraldbg.causal.evidence import extract
    from neuraldbg.session import load_session

    root = Path(source)
    if not root.is_dir():
        raise TuneError(f"{root}: runs directory not found")
    out, skipped = [], 0
    for rec in _read_records(root):
        if family is not None and rec.get("family") != family:
            continue
        if not _empty(rec.get("error")):
            skipped += 1
            continue
        key = rec.get("key") if not _empty(rec.get("key")) else f"{rec['arch']}__{rec['injection']}__{rec['seed']}"
        path = root / str(rec["session"]) if not _empty(rec.get("session")) else root / "sessions" / f"{key}.json"
        if not path.is_file():
            skipped += 1
            continue
        try:
            trace = load_session(path).trace()
        except (OSError, ValueError) as exc:
            log.warning("tune: session %s unreadable, skipped (%s)", path, exc)
            skipped += 1
            continue
        try:
            truth = truth_of(rec.get("true_cause"), rec.get("true_state"))
        except TuneError as exc:  # a state added to the zoo but not (yet) to the network
            log.warning("tune: record %s skipped: %s", key, exc)
            skipped += 1
            continue
        obs = extract(trace).observed
        out.append(Run(key=str(key), family=str(rec.get("family") or trace.family), truth=truth,
                       evidence={k: (v if isinstance(v, str) else tuple(v)) for k, v in obs.items()},
                       arch=str(rec.get("arch", "")), injection=str(rec.get("injection", "")),
                       seed=int(rec.get("seed", 0)), code=None if _empty(rec.get("code")) else str(rec["code"]),
                       ruled_out=tuple(sorted(impossible(trace)))))
    if skipped:
        log.warning("tune: %d record(s) of %s skipped (error or no session file)", skipped, root)
    return out


def other_code(runs: Iterable[Run]) -> list[str]:
    """The codes other than this checkout's (:func:`neuraldbg.source.code_version`) that
    recorded some of ``runs``, sorted; runs that do not say are left out."""
    code = code_version()
    return sorted({r.code for r in runs if r.code is not None and r.code != code})


def inputs_hash(runs: Sequence[Run]) -> str:
    """SHA-256 of the training cases (key, family, truth, evidence), order-independent."""
    rows = sorted(json.dumps([r.key, r.family, dict(sorted(r.truth.items())),
                              {k: (v if isinstance(v, str) else list(v)) for k, v in sorted(r.evidence.items())}])
                  for r in runs)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()
