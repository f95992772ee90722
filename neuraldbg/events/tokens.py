"""Token-input shift: the distribution of the ids an embedding reads, against its warm-up.

A token model's input distribution lives in its ids, not in float statistics: a remapped
vocabulary or a new tokenizer leaves every embedding output with the statistics of a
random embedding row, yet changes *which* rows are read and in what order. The monitor
therefore keeps a hashed histogram of each embedding's ids (:func:`token_histogram`:
unigrams and adjacent bigrams, fixed size whatever the vocabulary) and this detector compares
it with the histogram of the warm-up checks.

The null is measured, not assumed: each warm-up batch is compared with the reference made of
the *other* warm-up batches (leave-one-out), which gives the distance a batch of the same
distribution shows by sampling noise alone at this batch size and vocabulary. A batch is
shifted beyond ``token_shift_factor`` times the largest warm-up distance (scaled up for a
smaller batch, whose noise is larger), and a shift is reported after ``regime_persistence``
shifted checks in a row, dated at the first.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuraldbg.events.base import DATA, Event, make_event

#: hashed unigram and bigram buckets: enough that a remap moves mass between buckets, small
#: enough that one histogram per checked step costs a few hundred floats
UNIGRAM_BUCKETS = 64
BIGRAM_BUCKETS = 256
BUCKETS = UNIGRAM_BUCKETS + BIGRAM_BUCKETS
#: bigram hash multiplier (a prime, so (a, b) and (b, a) land apart)
_MIX = 1_000_003


def token_histogram(ids: torch.Tensor) -> torch.Tensor:
    """Counts (float32, shape ``(BUCKETS,)``, on ``ids``' device) of the hashed unigrams and of
    the hashed adjacent pairs along the last dimension of an integer id tensor. Built with
    ``scatter_add`` (no device sync: ``bincount`` reads the maximum on the host)."""
    ids = ids.detach().long()
    uni = ids.reshape(-1).remainder(UNIGRAM_BUCKETS)
    h = torch.zeros(BUCKETS, dtype=torch.float32, device=ids.device)
    h.scatter_add_(0, uni, torch.ones(uni.shape, dtype=torch.float32, device=ids.device))
    if ids.dim() >= 1 and ids.shape[-1] >= 2:
        pairs = (ids[..., :-1] * _MIX + ids[..., 1:]).reshape(-1).remainder(BIGRAM_BUCKETS) + UNIGRAM_BUCKETS
        h.scatter_add_(0, pairs, torch.ones(pairs.shape, dtype=torch.float32, device=ids.device))
    return h


def histogram_distance(counts: np.ndarray, reference: np.ndarray) -> float:
    """Mean of the total-variation distances of the unigram and of the bigram parts of two
    count histograms (0: same distribution, 1: disjoint); a part empty in either is skipped."""
    parts = []
    for lo, hi in ((0, UNIGRAM_BUCKETS), (UNIGRAM_BUCKETS, BUCKETS)):
        a, b = counts[lo:hi], reference[lo:hi]
        sa, sb = a.sum(), b.sum()
        if sa > 0 and sb > 0:
            parts.append(0.5 * float(np.abs(a / sa - b / sb).sum()))
    return sum(parts) / len(parts) if parts else 0.0


def leave_one_out_distances(warmup: np.ndarray) -> np.ndarray:
    """Distance of each warm-up histogram (rows) to the sum of the others: the null band."""
    total = warmup.sum(axis=0)
    return np.array([histogram_distance(row, total - row) for row in warmup])


class TokenShiftDetector:
    """One embedding's id distribution against its warm-up (see the module docstring).

    ``update(step, counts)`` takes one checked step's histogram and returns the shift events
    it establishes; ``reference_ready`` says whether the null band is built (from then on the
    layer is watched, so the absence of a shift is an observation).
    """

    def __init__(self, layer: str, config) -> None:
        self.layer = layer
        self.config = config
        self._seen = 0
        self._warmup: list[np.ndarray] = []
        self._reference: np.ndarray | None = None
        self._threshold = math.inf
        self._ref_n = 0.0
        self._streak: list[tuple[int, float]] = []

    @property
    def reference_ready(self) -> bool:
        """Whether the warm-up reference and its null band exist."""
        return self._reference is not None

    def update(self, step: int, counts: np.ndarray) -> list[Event]:
        """Shift events at this step (empty while warming up or when nothing holds)."""
        n = float(counts[:UNIGRAM_BUCKETS].sum())
        if n <= 0:
            return []  # an empty batch is no observation
        self._seen += 1
        cfg = self.config
        if self._reference is None:
            if self._seen > cfg.shift_skip_checks:
                self._warmup.append(counts.astype(np.float64))
                if len(self._warmup) >= cfg.token_reference_checks:
                    w = np.stack(self._warmup)
                    self._reference = w.sum(axis=0)
                    self._threshold = cfg.token_shift_factor * float(leave_one_out_distances(w).max())
                    self._ref_n = float(w[:, :UNIGRAM_BUCKETS].sum(axis=1).mean())
                    self._warmup = []
            return []
        d = histogram_distance(counts, self._reference)
        # sampling noise of a distance grows as 1/sqrt(batch): a small last batch is not a shift
        thr = self._threshold * math.sqrt(max(1.0, self._ref_n / n))
        if not d > thr:
            self._streak = []
            return []
        self._streak.append((step, d))
        k = len(self._streak)
        if k < cfg.regime_persistence:
            return []
        first = k == cfg.regime_persistence
        at = self._streak[0][0] if first else step
        return [make_event(DATA, "shift", self.layer, at, d / thr if thr > 0 else 6.0,
                           {"at_input": 1.0, "token_distance": d, "threshold": thr},
                           end_step=step, count=k if first else 1)]
