"""Prior tuning: fit the causal network's CPDs to benchmark runs (issue 6; docs/priors.md).

Every benchmark run gives one training case: the discretized evidence its trace produced
(:func:`neuraldbg.causal.evidence.extract`) and the root-cause states that were injected
(healthy runs: every root ``ok``). The two mechanism nodes (``instability``,
``signal_decay``) are never observed, and some evidence is *partial* (a set of states) or
unobserved, so the tables are fitted by **expectation-maximization**:

* **E-step** (numpy, exact): with the roots known, a run's hidden part is the 9 joint
  states of the two latents; their posterior, and the posterior over the states of every
  partial observation, give expected counts for every non-root CPD;
* **M-step**: pgmpy's ``DiscreteBayesianEstimator`` with a Dirichlet prior whose
  pseudo-counts are the *base* (hand-set, noisy-MAX) CPD column times an equivalent sample
  size ``ess``, ``state_names`` passed explicitly, parents sorted. A parent configuration the
  runs never reach gets exactly its base column back (no NaN, no uniform column).

EM starts from the base CPDs, so the latents keep the meaning the hand-set tables give them
(the split of ``P(evidence | roots)`` into mechanism and symptom is not identifiable from
data alone; the structured prior anchors it). Root priors are **not** fitted: the
benchmark's injection mix is designed (one run per injection), not the frequency of faults
in the wild, so the family's hand-set root priors are kept. A per-family temperature is
chosen on held-out label log loss (K-fold by seed).

Public entry points: :func:`tune` (returns a :class:`TuneResult`; ``.write(path)``),
:func:`load_runs`, :func:`fit_cpds`, :func:`cross_validate`, :func:`predict`,
:func:`label_metrics`. The command line is ``neuraldbg tune-priors``.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.cpd import Cpd, build_cpds, strict_check
from neuraldbg.causal.structure import (EVIDENCE_NAMES, LATENT_NAMES, NODE_BY_NAME, ROOT_NAMES, ROOTS,
                                        states_of)
from neuraldbg.priors.loader import FAMILIES, Priors, load_priors, validate

log = logging.getLogger("neuraldbg")

#: Equivalent sample size per parent configuration: the base column counts as this many runs.
DEFAULT_ESS = 10.0
#: Folds of the held-out check (grouped by seed).
DEFAULT_FOLDS = 5
#: Temperatures tried on held-out log loss (1.0 included: "no change" is always a candidate).
TEMPERATURE_GRID: tuple[float, ...] = (0.25, 0.33, 0.4, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
#: EM stops when the penalized log-likelihood gains less than this per run, or after MAX_ITER.
TOL = 1e-7
MAX_ITER = 200
#: Label space and scoring constants, identical to ``benchmarks/metrics.py``.
HEALTHY = "healthy"
LABELS: tuple[str, ...] = (HEALTHY,) + tuple(f"{v}/{s}" for v, ss in ROOTS.items() for s in ss[1:])
N_BINS = 15
LOG_LOSS_EPS = 1e-6

#: Non-root nodes, the ones fitted (roots are kept from the base priors).
FITTED_NODES: tuple[str, ...] = LATENT_NAMES + EVIDENCE_NAMES


class TuneError(ValueError):
    """Runs or settings unusable for tuning (message says what and what is valid)."""


# ---------------------------------------------------------------------------------- runs

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
        df = pd.read_csv(csv)
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
        runs = [r if isinstance(r, Run) else Run(**r) for r in source]
        return [r for r in runs if family is None or r.family == family]
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
                       seed=int(rec.get("seed", 0))))
    if skipped:
        log.warning("tune: %d record(s) of %s skipped (error or no session file)", skipped, root)
    return out


def inputs_hash(runs: Sequence[Run]) -> str:
    """SHA-256 of the training cases (key, family, truth, evidence), order-independent."""
    rows = sorted(json.dumps([r.key, r.family, dict(sorted(r.truth.items())),
                              {k: (v if isinstance(v, str) else list(v)) for k, v in sorted(r.evidence.items())}])
                  for r in runs)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


# ------------------------------------------------------------------------- indexing

class _Index:
    """Hidden-state bookkeeping shared by the E-step and scoring.

    Hidden states are ordered like :class:`CompiledNetwork`: roots then latents in C order,
    so hidden index ``h = root_joint * n_latent + latent_joint``.
    """

    def __init__(self) -> None:
        self.hidden = ROOT_NAMES + LATENT_NAMES
        cards = [len(states_of(v)) for v in self.hidden]
        grid = np.indices(cards).reshape(len(cards), -1)
        self.index = {v: grid[i] for i, v in enumerate(self.hidden)}
        self.n_root = int(np.prod(cards[:len(ROOT_NAMES)]))
        self.n_lat = int(np.prod(cards[len(ROOT_NAMES):]))
        self.root_cards = cards[:len(ROOT_NAMES)]
        self.cfg: dict[str, np.ndarray] = {}     # node -> parent-configuration index, (n_root, n_lat)
        self.n_cfg: dict[str, int] = {}
        for name in FITTED_NODES:
            ps = NODE_BY_NAME[name].parents
            pc = [len(states_of(p)) for p in ps]
            self.cfg[name] = np.ravel_multi_index([self.index[p] for p in ps], pc).reshape(self.n_root, self.n_lat)
            self.n_cfg[name] = int(np.prod(pc))
        self.lat_state = {v: self.index[v].reshape(self.n_root, self.n_lat) for v in LATENT_NAMES}

    def root_joint(self, truth: Mapping[str, str]) -> int:
        return int(np.ravel_multi_index([ROOTS[v].index(truth.get(v, "ok")) for v in ROOT_NAMES], self.root_cards))


_IDX: _Index | None = None


def _idx() -> _Index:
    global _IDX
    if _IDX is None:
        _IDX = _Index()
    return _IDX


@dataclass
class _Data:
    """Runs encoded for the vectorized E-step: root joint, evidence masks, observed flags."""

    root: np.ndarray                       # (N,) root joint index of the truth
    masks: dict[str, np.ndarray]           # var -> (N, card) 1 for every state the run allows
    observed: dict[str, np.ndarray]        # var -> (N,) bool

    @classmethod
    def of(cls, runs: Sequence[Run]) -> "_Data":
        ix = _idx()
        n = len(runs)
        root = np.array([ix.root_joint(r.truth) for r in runs], dtype=np.intp)
        masks, observed = {}, {}
        for e in EVIDENCE_NAMES:
            states = states_of(e)
            m = np.ones((n, len(states)))
            o = np.zeros(n, dtype=bool)
            for i, r in enumerate(runs):
                v = r.evidence.get(e)
                if v is None:
                    continue
                allowed = [v] if isinstance(v, str) else list(v)
                bad = [s for s in allowed if s not in states]
                if bad or not allowed:
                    raise TuneError(f"run {r.key}: evidence {e}={v!r} names no state of {e}; "
                                    f"valid: {', '.join(states)}")
                m[i] = [1.0 if s in allowed else 0.0 for s in states]
                o[i] = True
            masks[e], observed[e] = m, o
        return cls(root, masks, observed)


# ---------------------------------------------------------------------------------- EM

def _columns(cpd: Cpd) -> np.ndarray:
    """``P(node | parents)`` at every hidden state, shaped ``(card, n_root, n_lat)``."""
    ix = _idx()
    col = cpd.values[(slice(None),) + tuple(ix.index[p] for p in cpd.parents)]
    return col.reshape(len(cpd.states), ix.n_root, ix.n_lat)


def _e_step(cpds: Mapping[str, Cpd], data: _Data) -> tuple[dict[str, np.ndarray], float]:
    """Expected counts ``{node: (card, n_cfg)}`` of every fitted node, and the log-likelihood
    of the evidence given the truths (latents and partial observations summed out)."""
    ix = _idx()
    R = data.root
    n = len(R)
    lat = np.arange(ix.n_lat)[None, :]
    logw = np.zeros((n, ix.n_lat))
    for v in LATENT_NAMES:
        col = _columns(cpds[v])
        with np.errstate(divide="ignore"):
            logw += np.log(col[ix.lat_state[v][R], R[:, None], lat])
    parts = {}
    for e in EVIDENCE_NAMES:
        obs = data.observed[e]
        if not obs.any():
            continue
        colR = _columns(cpds[e])[:, R, :]                       # (card, N, n_lat)
        lik = np.einsum("nc,cnl->nl", data.masks[e], colR)       # P(observation | parents)
        with np.errstate(divide="ignore"):
            logw += np.where(obs[:, None], np.log(lik), 0.0)
        parts[e] = (colR, lik)
    top = logw.max(axis=1, keepdims=True)
    if not np.all(np.isfinite(top)):
        bad = int(np.flatnonzero(~np.isfinite(top[:, 0]))[0])
        raise TuneError(f"run #{bad}: its evidence has probability zero under the current CPDs")
    w = np.exp(logw - top)
    z = w.sum(axis=1, keepdims=True)
    ll = float((np.log(z) + top).sum())
    w /= z
    counts: dict[str, np.ndarray] = {}
    for v in LATENT_NAMES:
        card, nc = len(states_of(v)), ix.n_cfg[v]
        flat = ix.lat_state[v][R] * nc + ix.cfg[v][R]
        counts[v] = np.bincount(flat.ravel(), weights=w.ravel(), minlength=card * nc).reshape(card, nc)
    for e in EVIDENCE_NAMES:
        card, nc = len(states_of(e)), ix.n_cfg[e]
        if e not in parts:
            counts[e] = np.zeros((card, nc))
            continue
        colR, lik = parts[e]
        obs = data.observed[e]
        cfg = ix.cfg[e][R].ravel()
        c = np.empty((card, nc))
        # posterior of the child state within the observed set, times the latent posterior
        share = w * obs[:, None] / np.where(lik > 0, lik, 1.0)
        for s in range(card):
            wt = share * data.masks[e][:, s:s + 1] * colR[s]
            c[s] = np.bincount(cfg, weights=wt.ravel(), minlength=nc)
        counts[e] = c
    return counts, ll


def pseudo_counts(base: Mapping[str, Cpd], ess: float) -> dict[str, np.ndarray]:
    """Dirichlet pseudo-counts ``ess * base column`` for every fitted node (pgmpy layout)."""
    return {n: ess * base[n].values_2d for n in FITTED_NODES}


def _m_step_numpy(counts: Mapping[str, np.ndarray], alpha: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for n, c in counts.items():
        tot = c + alpha[n]
        out[n] = tot / tot.sum(axis=0, keepdims=True)
    return out


def _m_step_pgmpy(counts: Mapping[str, np.ndarray], alpha: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same update through pgmpy's ``DiscreteBayesianEstimator`` on a weighted frame.

    Each node is estimated on its own family (node + sorted parents): one row per
    (child state, parent configuration) with an expected count, the count as the row weight.
    """
    import itertools

    import pandas as pd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from pgmpy.models import DiscreteBayesianNetwork
        from pgmpy.parameter_estimator import DiscreteBayesianEstimator
    out = {}
    for n, c in counts.items():
        parents = list(NODE_BY_NAME[n].parents)
        names = {n: list(states_of(n)), **{p: list(states_of(p)) for p in parents}}
        configs = list(itertools.product(*[names[p] for p in parents]))
        rows, weights = [], []
        for s, state in enumerate(names[n]):
            for j, conf in enumerate(configs):
                if c[s, j] > 0:
                    rows.append((state,) + conf)
                    weights.append(c[s, j])
        if not rows:  # no data at all: one zero-weight row keeps pgmpy's frame valid
            rows, weights = [(names[n][0],) + configs[0]], [0.0]
        frame = pd.DataFrame(rows, columns=[n] + parents)
        model = DiscreteBayesianNetwork([(p, n) for p in parents])
        est = DiscreteBayesianEstimator(state_names=names, prior_type="dirichlet", pseudo_counts={n: alpha[n]})
        with np.errstate(invalid="ignore", divide="ignore"):
            # pgmpy also estimates the parents as roots (no pseudo-counts: 0/0 for unseen
            # states); those tables are discarded, the node's own is complete
            est.fit(model, frame, sample_weight=np.asarray(weights))
        tab = next(t for t in est.parameters_ if t.variable == n)
        if list(tab.variables[1:]) != parents or list(tab.state_names[n]) != names[n]:
            raise AssertionError(f"pgmpy returned {n} with order {tab.variables}")  # pragma: no cover
        out[n] = np.asarray(tab.get_values(), dtype=float)
    return out


@dataclass(frozen=True)
class FitInfo:
    """How an EM fit went."""

    iterations: int
    converged: bool
    log_likelihood: float         # of the training evidence given the truths, at the end
    log_likelihood_start: float   # the same under the base CPDs
    n_runs: int


def fit_cpds(runs: Sequence[Run], base: Priors | Mapping[str, Cpd], ess: float = DEFAULT_ESS,
             max_iter: int = MAX_ITER, tol: float = TOL, engine: str = "pgmpy") -> tuple[dict[str, Cpd], FitInfo]:
    """Fit every non-root CPD to ``runs`` by EM, Dirichlet prior ``ess x base`` (see module doc).

    ``base`` is a :class:`Priors` (its CPDs, hand-set or fitted, are start and prior shape) or
    a full CPD dict. ``engine`` picks the M-step: ``"pgmpy"`` (DiscreteBayesianEstimator) or
    ``"numpy"`` (the same closed form, faster; used inside cross-validation). Root CPDs are
    returned unchanged.
    """
    if not ess > 0:
        raise TuneError(f"ess must be > 0, got {ess!r}")
    if engine not in ("pgmpy", "numpy"):
        raise TuneError(f"engine must be 'pgmpy' or 'numpy', got {engine!r}")
    cpds = dict(build_cpds(base.roots, base.cpds) if isinstance(base, Priors) else base)
    alpha = pseudo_counts(cpds, ess)
    m_step = _m_step_pgmpy if engine == "pgmpy" else _m_step_numpy
    data = _Data.of(runs)
    n = max(len(runs), 1)
    prev, ll0, it, converged, ll = -math.inf, math.nan, 0, False, math.nan
    for it in range(1, max_iter + 1):
        counts, ll = _e_step(cpds, data)
        if it == 1:
            ll0 = ll
        # MAP-EM objective (posterior mean = MAP under Dirichlet(alpha + 1)): monotone
        obj = ll + sum(float((alpha[k] * np.log(cpds[k].values_2d)).sum()) for k in FITTED_NODES)
        if obj - prev < tol * n:
            converged = True
            break
        prev = obj
        new = m_step(counts, alpha)
        for k, vals in new.items():
            old = cpds[k]
            cpds[k] = Cpd(k, old.states, old.parents, vals.reshape(old.values.shape))
    strict_check(cpds)
    log.info("tune: EM on %d runs: %d iterations, log-likelihood %.3f -> %.3f%s", len(runs), it, ll0, ll,
             "" if converged else " (not converged)")
    return cpds, FitInfo(it, converged, float(ll), float(ll0), len(runs))


# ---------------------------------------------------------------------------- scoring

@dataclass(frozen=True)
class Prediction:
    """Posteriors of a set of runs: root marginals, P(healthy), label distribution."""

    marginals: dict[str, np.ndarray]   # var -> (N, card)
    p_healthy: np.ndarray              # (N,)
    label_probs: np.ndarray            # (N, len(LABELS)), the benchmark's normalized scores


def _evidence_loglik(net: CompiledNetwork, data: _Data) -> np.ndarray:
    """``log P(evidence | hidden)`` for every run and hidden state, partial sets summed: (N, H)."""
    ll = np.zeros((len(data.root), net.n_hidden))
    for e, table in zip(EVIDENCE_NAMES, net.log_tables):
        obs = data.observed[e]
        if not obs.any():
            continue
        lik = data.masks[e][obs] @ np.exp(table[:, :-1]).T
        with np.errstate(divide="ignore"):
            ll[obs] += np.log(lik)
    return ll


def _predict_from(net: CompiledNetwork, ll: np.ndarray, temperature: float) -> Prediction:
    lj = ll / temperature + net.log_prior
    lj -= lj.max(axis=1, keepdims=True)
    p = np.exp(lj)
    p /= p.sum(axis=1, keepdims=True)
    marg = {v: p @ net._onehot[v] for v in ROOT_NAMES}
    p_ok = p @ net.healthy_mask.astype(float)
    scores = np.column_stack([p_ok] + [marg[v][:, i] for v, ss in ROOTS.items() for i in range(1, len(ss))])
    tot = scores.sum(axis=1, keepdims=True)
    return Prediction(marg, p_ok, np.where(tot > 0, scores / np.where(tot > 0, tot, 1), 1 / len(LABELS)))


def predict(cpds: Mapping[str, Cpd], runs: Sequence[Run], temperature: float = 1.0) -> Prediction:
    """Posteriors of ``runs`` under ``cpds`` (exact enumeration, partial observations handled)."""
    net = CompiledNetwork(cpds)
    return _predict_from(net, _evidence_loglik(net, _Data.of(runs)), temperature)


def prior_mix_weights(runs: Sequence[Run], priors: Priors) -> np.ndarray:
    """Importance weights that turn the benchmark's designed label mix into the mix the root
    priors imply (``P(healthy)``, and each single fault with the other roots ok).

    The CPDs are conditional on the roots, so they do not depend on the mix; a temperature
    does: on a mix of ~90 % faulty runs, sharpening the evidence pays, in the wild (mostly
    healthy runs) it turns detector noise into false alarms. Weights have mean 1 over the
    labelled runs; runs without a single label get 0.
    """
    ok = {v: priors.roots[v]["ok"] for v in ROOT_NAMES}
    pi = {HEALTHY: math.prod(ok.values())}
    for v, ss in ROOTS.items():
        for st in ss[1:]:
            pi[f"{v}/{st}"] = priors.roots[v][st] * math.prod(o for u, o in ok.items() if u != v)
    labels = [r.label for r in runs]
    present = [lab for lab in labels if lab is not None]
    if not present:
        return np.zeros(len(runs))
    freq = {lab: present.count(lab) / len(present) for lab in set(present)}
    z = sum(pi[lab] for lab in freq)
    w = np.array([0.0 if lab is None else pi[lab] / z / freq[lab] for lab in labels])
    return w * (len(present) / w.sum())


def label_metrics(probs: np.ndarray, runs: Sequence[Run], marginals: Mapping[str, np.ndarray] | None = None,
                  weights: np.ndarray | None = None) -> dict[str, float]:
    """Benchmark scores of label distributions: ``log_loss`` (clipped at 1e-6), ``brier``,
    ``ece`` (top label, 15 bins), ``top1``; with ``marginals`` also ``root_log_loss`` (mean
    over roots of -log P(true state), a proper score of the network's own outputs); with
    ``weights`` (:func:`prior_mix_weights`) also ``mix_log_loss``, the log loss on the label
    mix of the root priors. Runs with several injected faults have no label and are left
    out of the label scores."""
    keep = np.array([r.label is not None for r in runs], dtype=bool)
    out: dict[str, float] = {"n": int(keep.sum())}
    if keep.any():
        p = probs[keep]
        y = np.array([LABELS.index(r.label) for r, k in zip(runs, keep) if k])
        rows = np.arange(len(y))
        nll = -np.log(np.clip(p[rows, y], LOG_LOSS_EPS, 1))
        out["log_loss"] = float(nll.mean())
        if weights is not None:
            out["mix_log_loss"] = float(np.average(nll, weights=np.asarray(weights)[keep]))
        onehot = np.zeros_like(p)
        onehot[rows, y] = 1
        out["brier"] = float(((p - onehot) ** 2).sum(axis=1).mean())
        pred = np.argsort(-p, axis=1, kind="stable")[:, 0]
        conf = p[rows, pred]
        hit = (pred == y).astype(float)
        b = np.clip(np.ceil(np.clip(conf, 0, 1) * N_BINS).astype(int) - 1, 0, N_BINS - 1)
        out["ece"] = float(np.abs(np.bincount(b, weights=hit - conf, minlength=N_BINS)).sum() / len(y))
        out["top1"] = float(hit.mean())
    else:
        out.update(log_loss=math.nan, brier=math.nan, ece=math.nan, top1=math.nan)
        if weights is not None:
            out["mix_log_loss"] = math.nan
    if marginals is not None and runs:
        ll = []
        for v in ROOT_NAMES:
            t = np.array([ROOTS[v].index(r.truth[v]) for r in runs])
            ll.append(-np.log(np.clip(marginals[v][np.arange(len(t)), t], LOG_LOSS_EPS, 1)).mean())
        out["root_log_loss"] = float(np.mean(ll))
    return out


# --------------------------------------------------------------------- cross-validation

def fold_groups(runs: Sequence[Run], folds: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """Fold of every run, and the grouping used: by **seed** when the runs have at least
    ``folds`` distinct seeds (every run of a seed is held out together, so no
    architecture x injection pair leaks its own seed), else by run (a quick benchmark has one seed)."""
    seeds = sorted({r.seed for r in runs})
    if len(seeds) >= folds:
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(seeds))
        fold_of = {s: int(i % folds) for s, i in zip([seeds[j] for j in order], range(len(seeds)))}
        return np.array([fold_of[r.seed] for r in runs]), "seed"
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(runs))
    f = np.empty(len(runs), dtype=int)
    f[perm] = np.arange(len(runs)) % folds
    return f, "run"


@dataclass(frozen=True)
class CVResult:
    """Held-out predictions of a K-fold check: hand-set (base) vs fitted, and the temperature."""

    runs: tuple[Run, ...]
    folds: np.ndarray
    grouping: str
    base: Prediction
    fitted: Prediction             # fitted CPDs at temperature 1
    fitted_t: Prediction           # fitted CPDs at the chosen temperature
    temperature: float
    temperature_loss: dict[float, float]
    weights: np.ndarray            # prior-mix importance weights of the runs
    criterion: str

    def metrics(self) -> dict[str, dict[str, float]]:
        """Held-out scores: ``hand_set``, ``fitted`` (T = 1), ``fitted_tempered``."""
        return {name: label_metrics(p.label_probs, self.runs, p.marginals, self.weights)
                for name, p in (("hand_set", self.base), ("fitted", self.fitted), ("fitted_tempered", self.fitted_t))}


def _stack(preds: list[tuple[np.ndarray, Prediction]], n: int) -> Prediction:
    marg = {v: np.zeros((n, len(ROOTS[v]))) for v in ROOT_NAMES}
    p_ok, lab = np.zeros(n), np.zeros((n, len(LABELS)))
    for idx, p in preds:
        for v in ROOT_NAMES:
            marg[v][idx] = p.marginals[v]
        p_ok[idx], lab[idx] = p.p_healthy, p.label_probs
    return Prediction(marg, p_ok, lab)


def cross_validate(runs: Sequence[Run], base: Priors, ess: float = DEFAULT_ESS, folds: int = DEFAULT_FOLDS,
                   seed: int = 0, temperatures: Sequence[float] = TEMPERATURE_GRID,
                   max_iter: int = MAX_ITER, criterion: str = "prior_mix") -> CVResult:
    """K-fold check: fit on K-1 folds (numpy M-step, same estimate as pgmpy's), predict the
    held-out fold under the base priors and the fitted CPDs at every temperature; the chosen
    temperature minimizes the pooled held-out label log loss, reweighted to the root priors'
    label mix (``criterion="prior_mix"``, see :func:`prior_mix_weights`) or on the runs as
    they are (``"benchmark"``)."""
    if criterion not in ("prior_mix", "benchmark"):
        raise TuneError(f"criterion must be 'prior_mix' or 'benchmark', got {criterion!r}")
    runs = tuple(runs)
    if folds < 2:
        raise TuneError(f"folds must be >= 2, got {folds}")
    if len(runs) < folds:
        raise TuneError(f"{len(runs)} runs cannot be split into {folds} folds")
    fold, grouping = fold_groups(runs, folds, seed)
    base_cpds = build_cpds(base.roots, base.cpds)
    base_net = CompiledNetwork(base_cpds)
    grid = sorted(set(float(t) for t in temperatures) | {1.0})
    b_preds, f_preds = [], {t: [] for t in grid}
    for k in range(folds):
        test = np.flatnonzero(fold == k)
        train = np.flatnonzero(fold != k)
        if not len(test):
            continue
        test_runs = [runs[i] for i in test]
        tdata = _Data.of(test_runs)
        b_preds.append((test, _predict_from(base_net, _evidence_loglik(base_net, tdata), base.temperature)))
        cpds, _ = fit_cpds([runs[i] for i in train], base_cpds, ess=ess, max_iter=max_iter, engine="numpy")
        net = CompiledNetwork(cpds)
        ll = _evidence_loglik(net, tdata)
        for t in grid:
            f_preds[t].append((test, _predict_from(net, ll, t)))
    n = len(runs)
    stacked = {t: _stack(f_preds[t], n) for t in grid}
    weights = prior_mix_weights(runs, base)
    key = "mix_log_loss" if criterion == "prior_mix" else "log_loss"
    losses = {t: label_metrics(stacked[t].label_probs, runs, weights=weights)[key] for t in grid}
    best = min(grid, key=lambda t: (losses[t], abs(math.log(t))))  # ties: closest to 1
    return CVResult(runs, fold, grouping, _stack(b_preds, n), stacked[1.0], stacked[best], best, losses,
                    weights, criterion)


# ------------------------------------------------------------------------------- tune

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
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, p)
        return str(p)


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def _cpds_section(cpds: Mapping[str, Cpd], engine: str) -> dict[str, dict[str, Any]]:
    if engine == "pgmpy":
        # through the checked pgmpy model: check_model(), strict sums, sorted parents
        from neuraldbg.causal.network import build_model, cpds_from_model
        return cpds_from_model(build_model(cpds))
    return {n: {"parents": list(cpds[n].parents), "states": list(cpds[n].states),
                "values": cpds[n].values_2d.tolist()} for n in FITTED_NODES}


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
    doc = {"schema_version": pri.schema_version, "family": pri.family, "roots": {k: dict(v) for k, v in pri.roots.items()},
           "cpds": b["cpds"], "temperature": b.get("temperature", 1.0), "reasoning": b.get("reasoning", {}),
           "provenance": {"method": b.get("method", "hand-set"), "recovered_from": pri.source}}
    log.info("tune: %s is fitted; starting from its recorded hand-set base", pri.source)
    return validate(doc, source=f"{b.get('source', '?')} (hand-set base recorded in {pri.source})", family=pri.family)


def tune(records_or_sessions: str | os.PathLike | Iterable[Run], family: str, *, ess: float = DEFAULT_ESS,
         folds: int = DEFAULT_FOLDS, base: str | os.PathLike | Priors | None = None, temperature: bool = True,
         seed: int = 0, max_iter: int = MAX_ITER, engine: str = "pgmpy",
         criterion: str = "prior_mix") -> TuneResult:
    """Fit ``family``'s CPDs to benchmark runs; return the prior file as a :class:`TuneResult`.

    ``records_or_sessions``: a benchmark output directory (``records.csv`` + ``sessions/``)
    or :class:`Run` objects. ``base``: the priors to start from and shrink toward (default:
    the family's shipped file); their root priors are kept. With ``folds >= 2`` a K-fold
    check by seed scores hand-set vs fitted on held-out runs (stored in the provenance) and,
    with ``temperature``, picks the temperature (``criterion``: see :func:`cross_validate`);
    ``folds=0`` skips it (temperature 1).
    """
    if family not in FAMILIES:
        raise TuneError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    all_runs = load_runs(records_or_sessions)
    runs = [r for r in all_runs if r.family == family]
    if not runs:
        have = sorted({r.family for r in all_runs})
        raise TuneError(f"no runs of family {family!r} in {records_or_sessions if isinstance(records_or_sessions, (str, os.PathLike)) else 'the given runs'}"
                        f" (families present: {', '.join(have) or 'none'})")
    base_pri = base if isinstance(base, Priors) else (load_priors(path=base) if base is not None else load_priors(family))
    base_pri = hand_set_base(base_pri)
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
                          f"ess={ess:g} x the base tables); root priors kept from {base_pri.source}.")
    doc["cpds"] = _cpds_section(cpds, engine)
    doc["temperature"] = float(temp)
    reasoning = {k: v for k, v in base_pri.reasoning.items() if not k.startswith("cpds.")}
    reasoning["cpds"] = ("Every non-root table fitted by EM to the runs named in provenance, shrunk toward "
                         f"the base tables ({base_pri.source}) with {ess:g} pseudo-runs per parent "
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
        "base": {"source": base_pri.source, "fingerprint": base_pri.fingerprint,
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


__all__ = ["DEFAULT_ESS", "DEFAULT_FOLDS", "LABELS", "TEMPERATURE_GRID", "CVResult", "FitInfo", "Prediction",
           "Run", "TuneError", "TuneResult", "cross_validate", "fit_cpds", "fold_groups", "inputs_hash",
           "hand_set_base", "label_metrics", "load_runs", "predict", "prior_mix_weights", "pseudo_counts", "truth_of", "tune"]
