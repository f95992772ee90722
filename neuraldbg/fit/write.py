"""The fitted prior file: :func:`tune` runs the fit and writes the file with its provenance.

Root priors are **not** fitted: the benchmark's injection mix is designed (one run per
injection), not the frequency of faults in the wild, so the family's hand-set root priors are
kept. The file records the hand-set base it was shrunk toward, so re-tuning a fitted file
never counts the same runs twice.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from neuraldbg.causal.cpd import Cpd
from neuraldbg.causal.priors import Priors, load_priors, validate
from neuraldbg.causal.structure import default_network
from neuraldbg.fit.cases import Run, TuneError, inputs_hash, load_runs, other_code
from neuraldbg.fit.em import DEFAULT_ESS, MAX_ITER, TOL, FitInfo, fit_cpds, fitted_nodes
from neuraldbg.fit.select import DEFAULT_FOLDS, CVResult, cross_validate
from neuraldbg.jsonio import write_json_atomic
from neuraldbg.source import code_version
from neuraldbg.vocab import FAMILIES

log = logging.getLogger("neuraldbg")


@dataclass(frozen=True)
class TuneResult:
    """A fitted prior file (``data``, validated as ``priors``) and how it was obtained."""

    data: dict[str, Any]
    priors: Priors
    fit: FitInfo
    heldout: dict[str, Any] | None = None
    cv: CVResult | None = field(default=None, repr=False)

    def write(self, path: str | os.PathLike) -> str:
        """Write the prior file (JSON, atomically); returns the path."""
        return write_json_atomic(path, self.data, indent=1)


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def _cpds_section(cpds: Mapping[str, Cpd], engine: str) -> dict[str, dict[str, Any]]:
    network = default_network()
    if engine == "pgmpy":
        # through the checked pgmpy model: check_model(), strict sums, sorted parents
        from neuraldbg.causal.network import build_model, cpds_from_model
        return cpds_from_model(build_model(cpds, network), network)
    return {n: {"parents": list(cpds[n].parents), "states": list(cpds[n].states),
                "values": cpds[n].values_2d.tolist()} for n in fitted_nodes(network)}


def hand_set_base(pri: Priors) -> Priors:
    """The priors a fit starts from and shrinks toward: ``pri`` itself, or, when ``pri`` is a
    fitted file, the hand-set base recorded in its provenance. Re-tuning a shipped file that
    was already fitted (``make priors`` twice) must not count the same runs twice."""
    prov = pri.provenance
    if prov.get("method") != "fitted":
        return pri
    b = prov.get("base") or {}
    if "cpds" not in b:
        log.warning("tune: %s is fitted but records no hand-set base; shrinking toward it as is", pri.source)
        return pri
    # the roots are never fitted, so their reasoning is the fitted file's own; the base records
    # only the reasoning of its tables
    reasoning = {**{k: v for k, v in pri.reasoning.items() if k in pri.roots}, **b.get("reasoning", {})}
    source = b.get("source", "?")
    doc = {"schema_version": pri.schema_version, "family": pri.family, "network": pri.network,
           "roots": {k: dict(v) for k, v in pri.roots.items()},
           "cpds": b["cpds"], "temperature": b.get("temperature", 1.0), "reasoning": reasoning,
           # the base's own source, so that a refit of the refit records it once (base_source)
           "provenance": {"method": b.get("method", "hand-set"), "recovered_from": pri.source, "source": source}}
    log.info("tune: %s is fitted; starting from its recorded hand-set base", pri.source)
    return validate(doc, source=f"{source} (hand-set base recorded in {pri.source})", family=pri.family)


def base_source(pri: Priors) -> str:
    """Where a base's tables come from: its own file, or for a base recovered from a fitted
    file, the source that file recorded (never the recovered label, which would nest)."""
    return str(pri.provenance.get("source", pri.source)) if "recovered_from" in pri.provenance else pri.source


def _check_current(runs: Sequence[Run], family: str, source: Any, allow_stale: bool) -> None:
    """Refuse runs recorded by other code (see :func:`tune`); warn about runs that do not say."""
    code = code_version()
    stale = other_code(runs)
    n_stale = sum(r.code in stale for r in runs)
    unknown = sum(r.code is None for r in runs)
    where = source if isinstance(source, (str, os.PathLike)) else "the given runs"
    if n_stale and not allow_stale:
        raise TuneError(f"{n_stale} of {len(runs)} {family} runs in {where} were recorded by other code "
                        f"({', '.join(stale)}) than this checkout's ({code}): their sessions hold the events "
                        "the monitor recorded then. Run the benchmark again into the same folder (python -m "
                        "benchmarks run --out DIR runs them again), or pass allow_stale=True (--allow-stale) "
                        "to fit them anyway")
    if n_stale:
        log.warning("tune: fitting %d %s run(s) recorded by other code (%s) than this checkout's (%s)",
                    n_stale, family, ", ".join(stale), code)
    if unknown and isinstance(source, (str, os.PathLike)):
        log.warning("tune: %d %s run(s) in %s do not say which code recorded them (no 'code' column): "
                    "they may be stale", unknown, family, source)


def tune(records_or_sessions: str | os.PathLike | Iterable[Run], family: str, *, ess: float = DEFAULT_ESS,
         folds: int = DEFAULT_FOLDS, base: str | os.PathLike | Priors | None = None, temperature: bool = True,
         seed: int = 0, max_iter: int = MAX_ITER, engine: str = "pgmpy",
         criterion: str = "prior_mix", allow_stale: bool = False) -> TuneResult:
    """Fit ``family``'s CPDs to benchmark runs; return the prior file as a :class:`TuneResult`.

    ``records_or_sessions``: a benchmark output directory (``records.csv`` + ``sessions/``)
    or :class:`Run` objects. ``base``: the priors to start from and shrink toward (default:
    the family's shipped file); their root priors are kept. With ``folds >= 2`` a K-fold
    check by seed scores hand-set vs fitted on held-out runs (stored in the provenance) and,
    with ``temperature``, picks the temperature (``criterion``: see :func:`cross_validate`);
    ``folds=0`` skips it (temperature 1).

    Runs recorded by other code than this checkout's (their ``code``,
    :func:`neuraldbg.source.code_version`) raise :class:`TuneError` unless ``allow_stale``: their
    sessions hold the events the monitor recorded then, and priors fitted to them are stale
    from the start. Runs that do not say which code made them are fitted, with a warning.
    """
    if family not in FAMILIES:
        raise TuneError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    all_runs = load_runs(records_or_sessions)
    runs = [r for r in all_runs if r.family == family]
    if not runs:
        have = sorted({r.family for r in all_runs})
        where = records_or_sessions if isinstance(records_or_sessions, (str, os.PathLike)) else "the given runs"
        raise TuneError(f"no runs of family {family!r} in {where} (families present: {', '.join(have) or 'none'})")
    _check_current(runs, family, records_or_sessions, allow_stale)
    if isinstance(base, Priors):
        base_pri = base
    else:
        base_pri = load_priors(path=base) if base is not None else load_priors(family)
    base_pri = hand_set_base(base_pri)
    src = base_source(base_pri)
    cv = None
    heldout = None
    temp = 1.0
    if folds and folds >= 2:
        if len(runs) < folds:
            log.warning("tune: %d runs of %s, too few for %d folds; no held-out check", len(runs), family, folds)
        else:
            cv = cross_validate(runs, base_pri, ess=ess, folds=folds, seed=seed, max_iter=max_iter,
                                criterion=criterion)
            temp = cv.temperature if temperature else 1.0
            heldout = {"folds": folds, "grouping": cv.grouping, "temperature_criterion": cv.criterion,
                       "temperature_grid": {str(k): _round(v) for k, v in cv.temperature_loss.items()},
                       **{k: _round(v) for k, v in cv.metrics().items()}}
    cpds, info = fit_cpds(runs, base_pri, ess=ess, max_iter=max_iter, engine=engine)
    doc = base_pri.to_dict()
    doc["family"] = family
    doc["description"] = (f"{family}: CPDs fitted to {len(runs)} benchmark runs (EM, Dirichlet prior "
                          f"ess={ess:g} x the base tables); root priors kept from {src}.")
    doc["cpds"] = _cpds_section(cpds, engine)
    doc["temperature"] = float(temp)
    reasoning = {k: v for k, v in base_pri.reasoning.items() if not k.startswith("cpds.")}
    reasoning["cpds"] = ("Every non-root table fitted by EM to the runs named in provenance, shrunk toward "
                         f"the base tables ({src}) with {ess:g} pseudo-runs per parent "
                         "configuration; configurations the runs never reach keep the base column.")
    doc["reasoning"] = reasoning
    import neuraldbg
    try:
        import pgmpy
        pgmpy_version = pgmpy.__version__
    except Exception:  # pragma: no cover - pgmpy is a dependency
        pgmpy_version = None
    doc["provenance"] = {
        "method": "fitted",
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "neuraldbg_version": neuraldbg.__version__,
        "pgmpy_version": pgmpy_version,
        # the hand-set base itself, so re-tuning this file shrinks toward it, not toward this fit
        "base": {"source": base_source(base_pri), "fingerprint": base_pri.fingerprint,
                 "method": base_pri.provenance.get("method"), "temperature": base_pri.temperature,
                 "cpds": {k: dict(v) for k, v in base_pri.cpds.items()},
                 "reasoning": {k: v for k, v in base_pri.reasoning.items() if k.startswith("cpds.")}},
        "fitted_on": {
            "source": str(records_or_sessions) if isinstance(records_or_sessions, (str, os.PathLike)) else "runs",
            "records": len(runs),
            "seeds": sorted({r.seed for r in runs}),
            "architectures": sorted({r.arch for r in runs}),
            "injections": sorted({r.injection for r in runs}),
            "sha256": inputs_hash(runs),
            # the code that fitted them; the runs were recorded by it too unless allow_stale
            "code": code_version(),
            "recorded_by": sorted({r.code for r in runs if r.code is not None}),
        },
        "estimator": {"method": "EM (exact E-step over the latent mechanisms and partial observations)",
                      "m_step": ("pgmpy.parameter_estimator.DiscreteBayesianEstimator" if engine == "pgmpy"
                                 else "numpy closed form"),
                      "prior_type": "dirichlet", "pseudo_counts": "ess x base CPD column",
                      "ess": float(ess), "max_iter": max_iter, "tol": TOL,
                      "iterations": info.iterations, "converged": info.converged,
                      "train_log_likelihood": _round(info.log_likelihood),
                      "train_log_likelihood_base": _round(info.log_likelihood_start)},
        "roots": "kept from base (the benchmark's injection mix is designed, not natural)",
        "temperature": {"fitted": bool(temperature and cv is not None), "value": float(temp),
                        "criterion": ("held-out label log loss, runs reweighted to the root priors' label mix"
                                      if cv is None or cv.criterion == "prior_mix" else "held-out label log loss")},
        "heldout": heldout,
    }
    priors = validate(json.loads(json.dumps(doc)), source=f"<tuned {family}>", family=family)
    return TuneResult(doc, priors, info, heldout, cv)
