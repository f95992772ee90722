"""The readings of a classifier at its floor (``neuraldbg/causal/nodes/floor.py``), on hand-built
loss histories: single batches a confident model gets wrong, a merged episode's later peaks, and
the floor of a run entered on trained weights."""
from __future__ import annotations

import pytest

from neuraldbg.causal.nodes.floor import (LEVEL_POINTS, RECOVER_FACTOR, RECOVER_POINTS, confident_mistakes,
                                          excursions, floor_batch, trained_floor)
from tests.causal.floor_curves import (CHANCE, FLOOR, PEAKS, RESUMED, curve, floor_curve, history, spike_episode,
                                      spike_event, trace_view)


def test_a_spike_below_chance_gone_on_the_next_batches_is_a_confident_mistake():
    assert (RECOVER_POINTS, RECOVER_FACTOR) == (5, 2.0)  # the cut points the cases are computed for
    hist = history(curve())
    assert confident_mistakes([spike_event(80, 0.72, 0.012)], hist, CHANCE)
    # at or above chance level the model lost what it learned
    assert not confident_mistakes([spike_event(80, CHANCE, 0.012)], hist, CHANCE)
    assert not confident_mistakes([spike_event(80, 3.0, 0.012)], hist, CHANCE)
    # still up on the next batches: 0.03 against a level of 0.012 (2.5x)
    assert not confident_mistakes([spike_event(80, 0.72, 0.012)], history(curve(after=0.03)), CHANCE)
    assert confident_mistakes([spike_event(80, 0.72, 0.012)], history(curve(after=0.024)), CHANCE)
    # a merged episode's later peaks are unknown; no chance level (not a cross-entropy); no spike
    assert not confident_mistakes([spike_event(80, 0.72, 0.012, count=3)], hist, CHANCE)
    assert not confident_mistakes([spike_event(80, 0.72, 0.012)], hist, None)
    assert not confident_mistakes([], hist, CHANCE)
    # too few losses recorded after it to tell; every spike must qualify
    assert not confident_mistakes([spike_event(117, 0.72, 0.012)], hist, CHANCE)
    assert not confident_mistakes([spike_event(30, 0.72, 0.012), spike_event(80, 2.0, 0.012)], hist, CHANCE)


def test_a_merged_episode_s_later_peaks_are_read_from_the_history():

    assert LEVEL_POINTS == 20  # the spike detector's window (NeuralDbgConfig.spike_window)
    hist = history(floor_curve(PEAKS))
    # every loss above 2x the median of the 20 before it: the three peaks, each with its level
    assert excursions(hist, 30, 110) == [(30, 0.03, FLOOR), (80, 0.28, FLOOR), (110, 0.05, FLOOR)]
    assert excursions(hist, 31, 79) == []
    episode = spike_episode(30, 110, 3, 0.03)
    assert confident_mistakes([episode], hist, CHANCE)
    # a later peak at chance level, or one the loss stays up after (0.002 = 4x the floor for
    # the next five batches), is instability, although the first peak alone was a mistake
    assert not confident_mistakes([episode], history(floor_curve({**PEAKS, 80: 1.5})), CHANCE)
    stays_up = {i: 0.002 for i in range(81, 86)}
    assert not confident_mistakes([episode], history(floor_curve(PEAKS, after=stays_up)), CHANCE)
    # an occurrence the history does not hold (downsampled past it) cannot be read
    assert not confident_mistakes([spike_episode(30, 110, 4, 0.03)], hist, CHANCE)
    # the last peak at the run's last batches: what followed is unknown
    late = history(floor_curve({30: 0.03, 117: 0.05}))
    assert not confident_mistakes([spike_episode(30, 117, 2, 0.03)], late, CHANCE)


def test_floor_batch_and_trained_floor_on_hand_computed_histories():
    hist = history(floor_curve({17: 1.9 * FLOOR, 60: 2.1 * FLOOR}))
    assert floor_batch(hist, 17, FLOOR)              # 1.9x the floor, the next five at it
    assert not floor_batch(hist, 60, FLOOR)          # 2.1x: above RECOVER_FACTOR x the floor
    assert not floor_batch(hist, 117, FLOOR)         # fewer than five losses after it
    assert not floor_batch(hist, 500, FLOOR)         # not recorded
    risen = history(floor_curve({}, after={i: 0.002 for i in range(18, 30)}))
    assert not floor_batch(risen, 17, FLOOR)         # the next five at 4x the floor

    # the median of the first tenth (12 of 120 losses) of a run entered trained far below chance
    start = [FLOOR * (1 + i % 3) for i in range(120)]   # 5e-4, 1e-3, 1.5e-3, ...: median 1e-3
    assert trained_floor(trace_view(start, started_trained=RESUMED, out_features=4)) == pytest.approx(2 * FLOOR)
    assert trained_floor(trace_view(start, out_features=4)) is None                 # started at initialization
    assert trained_floor(trace_view(start, started_trained=RESUMED)) is None        # no chance level
    assert trained_floor(trace_view([1.0] * 120, started_trained=RESUMED, out_features=4)) is None  # not at its floor
