"""Why the latent mechanism nodes matter: a calibration experiment.

The *naive* alternative to the latent nodes connects every symptom straight to the roots,
with the same single-symptom probabilities ``P(symptom | roots)`` (the latent network's own
marginals), but treats symptoms as independent given the roots. When symptoms share a
mechanism (a blow-up shows as exploding gradients *and* a diverging loss *and* dead units),
the naive model multiplies the same evidence several times and becomes overconfident.

:func:`experiment` samples runs from the latent network (a world where symptoms do share
mechanisms), then scores both models' posteriors on the sampled truth: log loss and Brier
score of every root variable, and the expected calibration error (ECE) of ``P(healthy)``.
``python -m neuraldbg.causal.calibration`` prints the table quoted in docs/causal_model.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.cpd import Cpd, build_cpds
from neuraldbg.causal.structure import Network
from neuraldbg.scoring import ece


class NaiveNetwork:
    """Roots -> symptoms directly, symptoms independent given the roots (no latents)."""

    def __init__(self, net: CompiledNetwork) -> None:
        self.net = net
        # prior over the root joint from the latent network's hidden prior (latents summed out)
        self.root_prior = net.sum_latents(np.exp(net.log_prior))
        self.log_root_prior = np.log(self.root_prior)
        self.log_tables = [np.concatenate([np.log(net.root_likelihood[e]), np.zeros((net.n_root_joint, 1))], axis=1)
                           for e in net.network.evidence_names]
        cards = net.root_cards
        self.index = dict(zip(net.network.root_names, np.indices(cards).reshape(len(cards), -1)))

    def posterior_batch(self, codes: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Root marginals and P(healthy) for encoded cases (same interface as the latent net)."""
        codes = np.atleast_2d(codes)
        ll = np.tile(self.log_root_prior, (codes.shape[0], 1))
        for j, t in enumerate(self.log_tables):
            col = np.where(codes[:, j] < 0, t.shape[1] - 1, codes[:, j])
            ll += t[:, col].T
        ll -= ll.max(axis=1, keepdims=True)
        p = np.exp(ll)
        p /= p.sum(axis=1, keepdims=True)
        marg = {v: np.stack([p[:, self.index[v] == s].sum(axis=1) for s in range(len(self.net.states[v]))], axis=1)
                for v in self.net.network.root_names}
        return marg, p[:, 0]  # root joint index 0 is all-ok


def sample(cpds: dict[str, Cpd], network: Network, n: int, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Ancestral samples of ``network``: ``({root: state index (n,)}, evidence codes (n, E))``."""
    rng = np.random.default_rng(seed)
    vals: dict[str, np.ndarray] = {}
    order = network.all_variables()
    for v in order:
        cpd = cpds[v]
        table = cpd.values[(slice(None),) + tuple(vals[p] for p in cpd.parents)] if cpd.parents \
            else np.repeat(cpd.values[:, None], n, axis=1)
        cum = np.cumsum(table, axis=0)
        u = rng.random(n)
        vals[v] = np.minimum((u[None, :] > cum).sum(axis=0), len(cpd.states) - 1)
    codes = np.stack([vals[e] for e in network.evidence_names], axis=1)
    return {v: vals[v] for v in network.root_names}, codes


def _ece(p: np.ndarray, y: np.ndarray) -> float:
    """Calibration error of a binary probability ``p`` against outcomes ``y`` (0/1): the
    benchmark's ECE (:func:`neuraldbg.scoring.ece`) on the predicted side's confidence."""
    p = np.asarray(p, dtype=float)
    y = np.asarray(y, dtype=float)
    conf = np.where(p >= 0.5, p, 1 - p)
    return ece(conf, np.where(p >= 0.5, y, 1 - y))


@dataclass(frozen=True)
class Scores:
    """Calibration scores of one model on sampled runs."""

    log_loss: float        # mean over roots of -log P(true state)
    brier: float           # mean over roots of the multi-class Brier score
    ece_healthy: float     # expected calibration error of P(healthy)
    ece_states: float      # ECE pooled over every abnormal root state's posterior
    overconfident: float   # fraction of runs where the model puts >= 0.99 on a wrong root state


def score(marg: dict[str, np.ndarray], p_ok: np.ndarray, truth: dict[str, np.ndarray]) -> Scores:
    """Score posteriors against the sampled truth."""
    ll, br, wrong = [], [], np.zeros(len(p_ok), dtype=bool)
    pooled_p, pooled_y = [], []
    for v in truth:
        m, t = marg[v], truth[v]
        pt = np.clip(m[np.arange(len(t)), t], 1e-300, 1)
        ll.append(-np.log(pt).mean())
        onehot = np.eye(m.shape[1])[t]
        br.append(((m - onehot) ** 2).sum(axis=1).mean())
        wrong |= (m.max(axis=1) >= 0.99) & (m.argmax(axis=1) != t)
        pooled_p.append(m[:, 1:].ravel())
        pooled_y.append(onehot[:, 1:].ravel())
    healthy = np.all([t == 0 for t in truth.values()], axis=0).astype(float)
    return Scores(float(np.mean(ll)), float(np.mean(br)), _ece(p_ok, healthy),
                  _ece(np.concatenate(pooled_p), np.concatenate(pooled_y)), float(wrong.mean()))


def experiment(priors: Any = None, n: int = 20000, seed: int = 0, abnormal_only: bool = False) -> dict[str, Scores]:
    """Sample ``n`` runs from the latent network and score both models.

    With ``abnormal_only`` the sample keeps runs with at least one non-ok root (the runs a
    user would debug), where double counting matters most (``ece_healthy`` is then not
    meaningful: every kept run is unhealthy).
    """
    from neuraldbg.causal.api import compiled, resolve_priors

    pri = resolve_priors(priors=priors, family=None if priors is not None else "mlp")
    net = compiled(pri)
    cpds = build_cpds(pri.roots, pri.cpds, net.network)
    truth, codes = sample(cpds, net.network, n, seed)
    if abnormal_only:
        keep = ~np.all([t == 0 for t in truth.values()], axis=0)
        truth = {v: t[keep] for v, t in truth.items()}
        codes = codes[keep]
    out = {}
    for name, model in (("latent", net), ("naive", NaiveNetwork(net))):
        marg, p_ok = model.posterior_batch(codes)
        out[name] = score(marg, p_ok, truth)
    return out


def burst_example(priors: Any = None) -> dict[str, float]:
    """P(learning_rate = too_high) under both models for a burst of instability symptoms."""
    from neuraldbg.causal.api import compiled, resolve_priors

    net = compiled(resolve_priors(priors=priors, family=None if priors is not None else "mlp"))
    ev = {"exploding": "later", "loss_pattern": "divergence", "dead": "later", "data_nan": "inside_after",
          "data_shift": "absent", "vanishing": "later", "order": "grad_first"}
    codes = net.encode(ev)[None, :]
    out = {}
    for name, model in (("latent", net), ("naive", NaiveNetwork(net))):
        marg, p_ok = model.posterior_batch(codes)
        out[name] = float(marg["learning_rate"][0, 1])
    return out


def main() -> None:  # pragma: no cover - documentation helper
    """Print the calibration table of docs/causal_model.md."""
    for label, ab in (("all sampled runs", False), ("failing runs only", True)):
        res = experiment(abnormal_only=ab)
        print(f"{label}:")
        print(f"  {'model':8s} {'log loss':>9s} {'Brier':>7s} {'ECE healthy':>12s} {'ECE states':>11s} "
              f"{'>=0.99 & wrong':>15s}")
        for name, s in res.items():
            print(f"  {name:8s} {s.log_loss:9.4f} {s.brier:7.4f} {s.ece_healthy:12.4f} {s.ece_states:11.4f} "
                  f"{s.overconfident:15.4f}")
    print("burst of instability symptoms, P(learning_rate=too_high):", burst_example())


if __name__ == "__main__":  # pragma: no cover
    main()
