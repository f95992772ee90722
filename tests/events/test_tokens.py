"""Token-input shift: the hashed id histogram, its distance, and the detector's null band."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from neuraldbg.config import DetectorConfig
from neuraldbg.events.tokens import (BIGRAM_BUCKETS, BUCKETS, UNIGRAM_BUCKETS, TokenShiftDetector, histogram_distance,
                                     leave_one_out_distances, token_histogram)


def test_histogram_counts_unigrams_and_adjacent_pairs():
    ids = torch.tensor([[1, 2, 2], [3, 1, 1]])
    h = token_histogram(ids)
    assert h.shape == (BUCKETS,) and h.dtype == torch.float32
    uni = h[:UNIGRAM_BUCKETS]
    assert uni[1] == 3 and uni[2] == 2 and uni[3] == 1 and uni.sum() == 6
    assert h[UNIGRAM_BUCKETS:].sum() == 4  # two pairs per row, none across rows


def test_histogram_hashes_a_large_vocabulary_into_fixed_buckets():
    ids = torch.tensor([[50_000, 50_000 + UNIGRAM_BUCKETS, -1]])
    h = token_histogram(ids)
    assert h[50_000 % UNIGRAM_BUCKETS] == 2 and h[(-1) % UNIGRAM_BUCKETS] == 1
    assert len(h) == UNIGRAM_BUCKETS + BIGRAM_BUCKETS


def test_distance_is_total_variation_per_part():
    a = np.zeros(BUCKETS)
    b = np.zeros(BUCKETS)
    a[0], b[1] = 4, 4                      # disjoint unigrams: TV 1
    a[UNIGRAM_BUCKETS] = b[UNIGRAM_BUCKETS] = 2  # identical bigrams: TV 0
    assert histogram_distance(a, b) == pytest.approx(0.5)
    assert histogram_distance(a, a) == 0.0
    c = a.copy()
    c[UNIGRAM_BUCKETS] = 0  # an empty part is skipped, not a distance of 1
    assert histogram_distance(a, c) == 0.0


def test_leave_one_out_compares_each_row_with_the_others():
    w = np.zeros((3, BUCKETS))
    w[:, 0] = 1
    w[2, 0], w[2, 1] = 0, 1
    d = leave_one_out_distances(w)
    assert d[2] == pytest.approx(1.0) and d[0] == pytest.approx(0.5)


def zipf_stream(perm_from=None, steps=60, n=512, vocab=40, seed=0, small_at=None):
    g = torch.Generator().manual_seed(seed)
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(99))
    for step in range(steps):
        k = 32 if step == small_at else n
        ids = torch.multinomial(p, k, replacement=True, generator=g).view(-1, 16)
        if perm_from is not None and step >= perm_from:
            ids = perm[ids]
        yield step, token_histogram(ids).numpy().astype(np.float64)


def events_of(stream, **cfg):
    det = TokenShiftDetector("wte", DetectorConfig(**cfg))
    return det, [e for step, h in stream for e in det.update(step, h)]


@pytest.mark.parametrize("seed", range(3))
def test_a_stationary_stream_raises_nothing(seed):
    det, evs = events_of(zipf_stream(seed=seed))
    assert det.reference_ready and evs == []


@pytest.mark.parametrize("seed", range(3))
def test_a_vocabulary_remap_is_a_shift_at_its_onset(seed):
    _, evs = events_of(zipf_stream(perm_from=30, seed=seed))
    assert evs and evs[0].kind == "shift" and evs[0].layer == "wte"
    assert evs[0].step == 30 and evs[0].measured["at_input"] == 1.0


def test_a_small_last_batch_is_not_a_shift():
    _, evs = events_of(zipf_stream(small_at=40, seed=1), regime_persistence=1)
    assert evs == []


def test_nothing_is_reported_before_the_reference_exists():
    det, evs = events_of(zipf_stream(perm_from=5, steps=11))
    assert not det.reference_ready and evs == []


def test_an_empty_batch_is_no_observation():
    det = TokenShiftDetector("wte", DetectorConfig())
    assert det.update(0, np.zeros(BUCKETS)) == [] and det._seen == 0
