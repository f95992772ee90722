"""Expectation-maximization of the causal network's CPDs (see ``docs/priors.md``).

The mechanism nodes (``instability``, ``signal_decay``, ``corruption``) are never observed, and
some evidence is *partial* (a set of states) or unobserved, so the tables are fitted by EM:

* **E-step** (numpy, exact): with the roots known, a run's hidden part is the 27 joint
  states of the three latents; their posterior, and the posterior over the states of every
  partial observation, give expected counts for every non-root CPD;
* **M-step**: pgmpy's ``DiscreteBayesianEstimator`` with a Dirichlet prior whose
  pseudo-counts are the *base* (hand-set, noisy-MAX) CPD column times an equivalent sample
  size ``ess``, ``state_names`` passed explicitly, parents sorted. A parent configuration the
  runs never reach gets exactly its base column back (no NaN, no uniform column).

EM starts from the base CPDs, so the latents keep the meaning the hand-set tables give them
(the split of ``P(evidence | roots)`` into mechanism and symptom is not identifiable from
data alone; the structured prior anchors it). Root CPDs are never fitted.
"""
from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from neuraldbg.causal.cpd import Cpd, build_cpds, strict_check
from neuraldbg.causal.priors import Priors
from neuraldbg.causal.structure import Network, default_network
from neuraldbg.fit.cases import Run, TuneError

log = logging.getLogger("neuraldbg")

#: Equivalent sample size per parent configuration: the base column counts as this many runs.
DEFAULT_ESS = 10.0
#: EM stops when the penalized log-likelihood gains less than this per run, or after MAX_ITER.
TOL = 1e-7
MAX_ITER = 200


def fitted_nodes(network: Network) -> tuple[str, ...]:
    """The non-root nodes of ``network``, the ones fitted (roots are kept from the base priors)."""
    return network.latent_names + network.evidence_names


class _Index:
    """Hidden-state bookkeeping of one network, shared by the E-step and scoring.

    Hidden states are ordered like :class:`CompiledNetwork`: roots then latents in C order,
    so hidden index ``h = root_joint * n_latent + latent_joint``.
    """

    def __init__(self, network: Network) -> None:
        self.network = network
        n_roots, states_of = len(network.root_names), network.states_of
        self.hidden = network.root_names + network.latent_names
        cards = [len(states_of(v)) for v in self.hidden]
        grid = np.indices(cards).reshape(len(cards), -1)
        self.index = {v: grid[i] for i, v in enumerate(self.hidden)}
        self.n_root = int(np.prod(cards[:n_roots]))
        self.n_lat = int(np.prod(cards[n_roots:]))
        self.root_cards = cards[:n_roots]
        self.cfg: dict[str, np.ndarray] = {}     # node -> parent-configuration index, (n_root, n_lat)
        self.n_cfg: dict[str, int] = {}
        for name in fitted_nodes(network):
            ps = network.parents_of(name)
            pc = [len(states_of(p)) for p in ps]
            self.cfg[name] = np.ravel_multi_index([self.index[p] for p in ps], pc).reshape(self.n_root, self.n_lat)
            self.n_cfg[name] = int(np.prod(pc))
        self.lat_state = {v: self.index[v].reshape(self.n_root, self.n_lat) for v in network.latent_names}

    def root_joint(self, truth: Mapping[str, str]) -> int:
        net = self.network
        return int(np.ravel_multi_index([net.roots[v].index(truth.get(v, "ok")) for v in net.root_names],
                                        self.root_cards))


_IDX: dict[str, _Index] = {}


def _idx(network: Network) -> _Index:
    ix = _IDX.get(network.fingerprint)
    if ix is None:
        ix = _IDX[network.fingerprint] = _Index(network)
    return ix


@dataclass
class _Data:
    """Runs encoded for the vectorized E-step: root joint, evidence masks, observed flags."""

    root: np.ndarray                       # (N,) root joint index of the truth
    masks: dict[str, np.ndarray]           # var -> (N, card) 1 for every state the run allows
    observed: dict[str, np.ndarray]        # var -> (N,) bool

    @classmethod
    def of(cls, runs: Sequence[Run], network: Network) -> "_Data":
        ix = _idx(network)
        n = len(runs)
        root = np.array([ix.root_joint(r.truth) for r in runs], dtype=np.intp)
        masks, observed = {}, {}
        for e in network.evidence_names:
            states = network.states_of(e)
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

def _columns(cpd: Cpd, ix: _Index) -> np.ndarray:
    """``P(node | parents)`` at every hidden state, shaped ``(card, n_root, n_lat)``."""
    col = cpd.values[(slice(None),) + tuple(ix.index[p] for p in cpd.parents)]
    return col.reshape(len(cpd.states), ix.n_root, ix.n_lat)


def _e_step(cpds: Mapping[str, Cpd], data: _Data, network: Network) -> tuple[dict[str, np.ndarray], float]:
    """Expected counts ``{node: (card, n_cfg)}`` of every fitted node, and the log-likelihood
    of the evidence given the truths (latents and partial observations summed out)."""
    ix = _idx(network)
    states_of = network.states_of
    R = data.root
    n = len(R)
    lat = np.arange(ix.n_lat)[None, :]
    logw = np.zeros((n, ix.n_lat))
    for v in network.latent_names:
        col = _columns(cpds[v], ix)
        with np.errstate(divide="ignore"):
            logw += np.log(col[ix.lat_state[v][R], R[:, None], lat])
    parts = {}
    for e in network.evidence_names:
        obs = data.observed[e]
        if not obs.any():
            continue
        colR = _columns(cpds[e], ix)[:, R, :]                       # (card, N, n_lat)
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
    for v in network.latent_names:
        card, nc = len(states_of(v)), ix.n_cfg[v]
        flat = ix.lat_state[v][R] * nc + ix.cfg[v][R]
        counts[v] = np.bincount(flat.ravel(), weights=w.ravel(), minlength=card * nc).reshape(card, nc)
    for e in network.evidence_names:
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


def pseudo_counts(base: Mapping[str, Cpd], ess: float, network: Network) -> dict[str, np.ndarray]:
    """Dirichlet pseudo-counts ``ess * base column`` for every fitted node (pgmpy layout)."""
    return {n: ess * base[n].values_2d for n in fitted_nodes(network)}


def _m_step_numpy(counts: Mapping[str, np.ndarray], alpha: Mapping[str, np.ndarray],
                  network: Network) -> dict[str, np.ndarray]:
    out = {}
    for n, c in counts.items():
        tot = c + alpha[n]
        out[n] = tot / tot.sum(axis=0, keepdims=True)
    return out


def _m_step_pgmpy(counts: Mapping[str, np.ndarray], alpha: Mapping[str, np.ndarray],
                  network: Network) -> dict[str, np.ndarray]:
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
        parents = list(network.parents_of(n))
        names = {n: list(network.states_of(n)), **{p: list(network.states_of(p)) for p in parents}}
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
             max_iter: int = MAX_ITER, tol: float = TOL, engine: str = "pgmpy",
             network: Network | None = None) -> tuple[dict[str, Cpd], FitInfo]:
    """Fit every non-root CPD of ``network`` (default: this version's) to ``runs`` by EM,
    Dirichlet prior ``ess x base`` (see module doc).

    ``base`` is a :class:`Priors` (its CPDs, hand-set or fitted, are start and prior shape) or
    a full CPD dict. ``engine`` picks the M-step: ``"pgmpy"`` (DiscreteBayesianEstimator) or
    ``"numpy"`` (the same closed form, faster; used inside cross-validation). Root CPDs are
    returned unchanged.
    """
    network = network if network is not None else default_network()
    if not ess > 0:
        raise TuneError(f"ess must be > 0, got {ess!r}")
    if engine not in ("pgmpy", "numpy"):
        raise TuneError(f"engine must be 'pgmpy' or 'numpy', got {engine!r}")
    cpds = dict(build_cpds(base.roots, base.cpds, network) if isinstance(base, Priors) else base)
    alpha = pseudo_counts(cpds, ess, network)
    m_step = _m_step_pgmpy if engine == "pgmpy" else _m_step_numpy
    data = _Data.of(runs, network)
    n = max(len(runs), 1)
    prev, ll0, it, converged, ll = -math.inf, math.nan, 0, False, math.nan
    for it in range(1, max_iter + 1):
        counts, ll = _e_step(cpds, data, network)
        if it == 1:
            ll0 = ll
        # MAP-EM objective (posterior mean = MAP under Dirichlet(alpha + 1)): monotone
        obj = ll + sum(float((alpha[k] * np.log(cpds[k].values_2d)).sum()) for k in fitted_nodes(network))
        if obj - prev < tol * n:
            converged = True
            break
        prev = obj
        new = m_step(counts, alpha, network)
        for k, vals in new.items():
            old = cpds[k]
            cpds[k] = Cpd(k, old.states, old.parents, vals.reshape(old.values.shape))
    strict_check(cpds)
    log.info("tune: EM on %d runs: %d iterations, log-likelihood %.3f -> %.3f%s", len(runs), it, ll0, ll,
             "" if converged else " (not converged)")
    return cpds, FitInfo(it, converged, float(ll), float(ll0), len(runs))
