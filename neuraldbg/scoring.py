"""Scores of probabilistic diagnoses, as pure numpy functions: one implementation of each.

The benchmark (``benchmarks/metrics.py``), the prior fitter (``neuraldbg/fit``) and the
calibration experiment (``neuraldbg/causal/calibration.py``) all score with these.

Label distribution
------------------
The causal engine returns root-cause *marginals* and ``P(healthy)``. They are not one
distribution over the labels of :data:`neuraldbg.vocab.LABELS` (marginals of different
variables overlap), so every label is scored by ``P(healthy)`` or its marginal
``P(variable = state)`` and the scores are divided by their sum (:func:`label_distribution`).

Calibration
-----------
Top-label ECE with :data:`N_BINS` equal-width bins (Guo et al. 2017; bin ``m`` holds
confidences in ``((m-1)/N, m/N]``, bin 1 also holds 0). Plug-in ECE is biased upward at small
n, so :func:`ece_null_band` gives the band a perfectly calibrated predictor with the same
confidences would show.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from neuraldbg.vocab import ROOTS

#: Bins of the top-label ECE.
N_BINS = 15
#: Probability clip of the log loss: one confident miss costs at most -log(1e-6) = 13.8 nats,
#: so a single run cannot swamp the mean, yet overconfidence still shows.
LOG_LOSS_EPS = 1e-6


def normalize(scores: np.ndarray) -> np.ndarray:
    """Rows divided by their sums; an all-zero row becomes uniform."""
    s = np.asarray(scores, dtype=float)
    tot = s.sum(axis=1, keepdims=True)
    uniform = np.full_like(s, 1.0 / s.shape[1]) if s.ndim == 2 and s.shape[1] else s
    return np.where(tot > 0, s / np.where(tot > 0, tot, 1.0), uniform)


def label_distribution(p_healthy: np.ndarray, marginals: Mapping[str, np.ndarray]) -> np.ndarray:
    """``(N, len(LABELS))`` label distributions from ``P(healthy)`` ``(N,)`` and root marginals
    ``{variable: (N, card)}`` (columns in :data:`~neuraldbg.vocab.ROOTS` state order)."""
    cols = [np.asarray(p_healthy, dtype=float)]
    cols += [np.asarray(marginals[v])[:, i] for v, ss in ROOTS.items() for i in range(1, len(ss))]
    return normalize(np.column_stack(cols))


def ranking(scores: np.ndarray) -> np.ndarray:
    """Label indices per row, best first; ties keep label order (a stable sort)."""
    return np.argsort(-np.asarray(scores, dtype=float), axis=1, kind="stable")


def top_label(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(predicted index, confidence)`` per row of a distribution."""
    probs = np.asarray(probs, dtype=float)
    pred = ranking(probs)[:, 0] if len(probs) else np.zeros(0, dtype=int)
    return pred, probs[np.arange(len(probs)), pred]


def bin_index(confidence: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Equal-width bin of each confidence: bin m (0-based) holds ``(m/n, (m+1)/n]``, bin 0 also 0."""
    c = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
    return np.clip(np.ceil(c * n_bins).astype(int) - 1, 0, n_bins - 1)


def ece(confidence: np.ndarray, correct: np.ndarray, n_bins: int = N_BINS) -> float:
    """Expected calibration error: sum over bins of |accuracy - confidence| weighted by bin share."""
    c = np.asarray(confidence, dtype=float)
    ok = np.asarray(correct, dtype=float)
    if len(c) == 0:
        return math.nan
    gap = np.bincount(bin_index(c, n_bins), weights=ok - c, minlength=n_bins)
    return float(np.abs(gap).sum() / len(c))


def ece_null_band(confidence: np.ndarray, n_bins: int = N_BINS, draws: int = 2000,
                  level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """ECE expected from a perfectly calibrated predictor with these confidences.

    Each draw marks every row correct with probability equal to its confidence (what labels
    drawn from the model's own distribution do to the top label) and computes the ECE;
    returns the ``level`` central band (``lo``, ``hi``) and the ``median`` of the draws.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    c = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
    n = len(c)
    if n == 0:
        return {"lo": math.nan, "median": math.nan, "hi": math.nan}
    rng = np.random.default_rng(seed)
    b = bin_index(c, n_bins)
    out = np.empty(draws)
    chunk = max(1, 2_000_000 // n)  # chunks keep memory flat for large n x draws
    for start in range(0, draws, chunk):
        m = min(chunk, draws - start)
        hits = rng.random((m, n)) < c
        idx = (np.arange(m)[:, None] * n_bins + b[None, :]).ravel()
        gap = np.bincount(idx, weights=(hits - c).ravel(), minlength=m * n_bins).reshape(m, n_bins)
        out[start:start + m] = np.abs(gap).sum(axis=1) / n
    a = (1 - level) / 2
    lo, med, hi = np.quantile(out, [a, 0.5, 1 - a])
    return {"lo": float(lo), "median": float(med), "hi": float(hi)}


def check_probs(probs: np.ndarray) -> np.ndarray:
    """``probs`` as a 2-D float array of row distributions; ``ValueError`` otherwise."""
    p = np.asarray(probs, dtype=float)
    if p.ndim != 2:
        raise ValueError(f"probs must be 2-D (runs x labels), got shape {p.shape}")
    if len(p) and (np.any(p < -1e-12) or not np.allclose(p.sum(axis=1), 1.0, atol=1e-6)):
        raise ValueError("probs rows must be distributions (non-negative, summing to 1); use normalize()")
    return p


def brier(probs: np.ndarray, y: np.ndarray) -> float:
    """Multi-class Brier score: mean over rows of sum_k (q_k - 1[k = y])^2, in [0, 2]."""
    p = check_probs(probs)
    if len(p) == 0:
        return math.nan
    onehot = np.zeros_like(p)
    onehot[np.arange(len(p)), np.asarray(y, dtype=int)] = 1.0
    return float(((p - onehot) ** 2).sum(axis=1).mean())


def nll(probs: np.ndarray, y: np.ndarray, eps: float = LOG_LOSS_EPS) -> np.ndarray:
    """Per-row negative log probability of the true label, clipped to ``[eps, 1]``."""
    p = check_probs(probs)
    q = np.clip(p[np.arange(len(p)), np.asarray(y, dtype=int)], eps, 1.0)
    return -np.log(q)


def log_loss(probs: np.ndarray, y: np.ndarray, eps: float = LOG_LOSS_EPS) -> float:
    """Mean negative log probability of the true label, clipped to ``[eps, 1]``."""
    losses = nll(probs, y, eps)
    return float(losses.mean()) if len(losses) else math.nan
