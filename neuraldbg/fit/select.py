"""Scoring fitted tables on held-out runs, and choosing the temperature.

Label scores use :mod:`neuraldbg.scoring` (the benchmark's own functions) on the label
distribution of :func:`neuraldbg.scoring.label_distribution`; posteriors come from the
compiled network's batched :meth:`~neuraldbg.causal.compiled.CompiledNetwork.posterior_from_loglik`.
A per-family temperature is chosen on held-out label log loss (K-fold by seed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from neuraldbg import scoring
from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.cpd import Cpd, build_cpds
from neuraldbg.causal.priors import Priors
from neuraldbg.causal.structure import Network, default_network
from neuraldbg.fit.cases import Run, TuneError
from neuraldbg.fit.em import DEFAULT_ESS, MAX_ITER, _Data, fit_cpds
from neuraldbg.vocab import HEALTHY, LABELS, ROOT_NAMES, ROOTS

#: Folds of the held-out check (grouped by seed).
DEFAULT_FOLDS = 5
#: Temperatures tried on held-out log loss (1.0 included: "no change" is always a candidate).
TEMPERATURE_GRID: tuple[float, ...] = (0.25, 0.33, 0.4, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)

#: evidence variables whose likelihoods are multiplied before one logarithm (:func:`_evidence_loglik`)
LOG_EVERY = 6


@dataclass(frozen=True)
class Prediction:
    """Posteriors of a set of runs: root marginals, P(healthy), label distribution."""

    marginals: dict[str, np.ndarray]   # var -> (N, card)
    p_healthy: np.ndarray              # (N,)
    label_probs: np.ndarray            # (N, len(LABELS)), the benchmark's normalized scores


def _evidence_loglik(net: CompiledNetwork, data: _Data) -> np.ndarray:
    """``log P(evidence | hidden)`` for every run and hidden state, partial sets summed: (N, H)."""
    ll = np.zeros((len(data.root), net.n_hidden))
    # likelihoods are multiplied in linear space and logged once per LOG_EVERY variables: the
    # logarithm of an (N, H) array per variable was most of a fit's time; no entry of a table is
    # small enough for a product of LOG_EVERY of them to underflow (a 0 stays a 0: -inf)
    prod = np.ones_like(ll)
    pending = 0
    for e, table in zip(net.network.evidence_names, net.log_tables):
        obs = data.observed[e]
        if not obs.any():
            continue
        prod[obs] *= data.masks[e][obs] @ np.exp(table[:, :-1]).T
        pending += 1
        if pending == LOG_EVERY:
            with np.errstate(divide="ignore"):
                ll += np.log(prod)
            prod.fill(1.0)
            pending = 0
    if pending:
        with np.errstate(divide="ignore"):
            ll += np.log(prod)
    return ll


def rule_out(net: CompiledNetwork, ll: np.ndarray, runs: Sequence[Run]) -> np.ndarray:
    """``ll`` (N, H) with each run's ruled-out root states (``Run.ruled_out``) at -inf, as the
    online diagnosis excludes them (:meth:`CompiledNetwork.root_joint_posterior`); a run whose
    exclusions would leave no hidden state keeps its row (the evidence then decides). In place."""
    for i, r in enumerate(runs):
        if r.ruled_out:
            mask = net.excluded(r.ruled_out)
            if not mask.all():
                ll[i, mask] = -np.inf
    return ll


def _predict_from(net: CompiledNetwork, ll: np.ndarray, temperature: float) -> Prediction:
    marg, p_ok = net.posterior_from_loglik(ll, temperature)
    return Prediction(marg, p_ok, scoring.label_distribution(p_ok, marg))


def predict(cpds: Mapping[str, Cpd], runs: Sequence[Run], temperature: float = 1.0,
            network: Network | None = None) -> Prediction:
    """Posteriors of ``runs`` under ``cpds`` of ``network`` (default: this version's; exact
    enumeration, partial observations handled), without the root states each run lacks the
    preconditions of (``Run.ruled_out``)."""
    network = network if network is not None else default_network()
    net = CompiledNetwork(cpds, network)
    return _predict_from(net, rule_out(net, _evidence_loglik(net, _Data.of(runs, network)), runs), temperature)


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
        nll = scoring.nll(p, y)
        out["log_loss"] = float(nll.mean())
        if weights is not None:
            out["mix_log_loss"] = float(np.average(nll, weights=np.asarray(weights)[keep]))
        out["brier"] = scoring.brier(p, y)
        pred, conf = scoring.top_label(p)
        hit = pred == y
        out["ece"] = scoring.ece(conf, hit)
        out["top1"] = float(hit.mean())
    else:
        out.update(log_loss=math.nan, brier=math.nan, ece=math.nan, top1=math.nan)
        if weights is not None:
            out["mix_log_loss"] = math.nan
    if marginals is not None and runs:
        ll = []
        for v in ROOT_NAMES:
            t = np.array([ROOTS[v].index(r.truth[v]) for r in runs])
            ll.append(-np.log(np.clip(marginals[v][np.arange(len(t)), t], scoring.LOG_LOSS_EPS, 1)).mean())
        out["root_log_loss"] = float(np.mean(ll))
    return out


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
                   max_iter: int = MAX_ITER, criterion: str = "prior_mix", network: Network | None = None) -> CVResult:
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
    network = network if network is not None else default_network()
    base_cpds = build_cpds(base.roots, base.cpds, network)
    base_net = CompiledNetwork(base_cpds, network)
    grid = sorted(set(float(t) for t in temperatures) | {1.0})
    b_preds, f_preds = [], {t: [] for t in grid}
    for k in range(folds):
        test = np.flatnonzero(fold == k)
        train = np.flatnonzero(fold != k)
        if not len(test):
            continue
        test_runs = [runs[i] for i in test]
        tdata = _Data.of(test_runs, network)
        b_preds.append((test, _predict_from(base_net, rule_out(base_net, _evidence_loglik(base_net, tdata), test_runs),
                                            base.temperature)))
        cpds, _ = fit_cpds([runs[i] for i in train], base_cpds, ess=ess, max_iter=max_iter, engine="numpy",
                           network=network)
        net = CompiledNetwork(cpds, network)
        ll = rule_out(net, _evidence_loglik(net, tdata), test_runs)
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
