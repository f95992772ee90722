"""The paired window comparison that decides whether a symptom vanished."""
from __future__ import annotations

import math

import pytest

from neuraldbg.verify.outcome import (REFERENCE_TRADE, VANISHED_IMPROVEMENT, compare, late_steps, recurrences,
                                      reference_gain, relative_gain, symptoms_in)

NAN, INF = math.nan, math.inf


def test_relative_gain_is_scale_free_and_bounded():
    assert relative_gain(2.0, 1.0) == pytest.approx(0.5)
    assert relative_gain(2000.0, 1000.0) == pytest.approx(0.5)
    assert relative_gain(1.0, 2.0) == pytest.approx(-0.5)
    assert relative_gain(-1.0, -2.0) == pytest.approx(0.5)  # a negative loss that fell further
    assert relative_gain(0.0, 0.0) == 0.0
    assert relative_gain(NAN, 1.0) == 1.0 and relative_gain(INF, 1.0) == 1.0
    assert relative_gain(1.0, NAN) == -1.0
    assert relative_gain(NAN, INF) == 0.0


def test_late_steps_start_at_the_onset_or_the_middle():
    assert late_steps(0, 20, 0) == range(10, 20)
    assert late_steps(64, 90, 80) == range(80, 90)
    assert late_steps(0, 2, None) == range(1, 2)


def test_a_nan_curve_made_finite_vanished_and_an_unchanged_one_persisted():
    orig = {t: (1.0 if t < 5 else NAN) for t in range(20)}
    fixed = {t: 1.0 for t in range(20)}
    c = compare(orig, fixed, 0, 20, onset=5)
    assert c.outcome == "vanished" and c.improvement == 1.0
    assert (c.nonfinite_before, c.nonfinite_after) == (15, 0)
    same = compare(orig, dict(orig), 0, 20, onset=5)
    assert same.outcome == "persisted" and same.improvement == 0.0


def test_threshold_and_missing_original_points():
    orig = {t: 1.0 for t in range(0, 20, 2)}  # a strided loss history
    better = {t: 1.0 - 1.5 * VANISHED_IMPROVEMENT for t in range(20)}
    slightly = {t: 1.0 - 0.5 * VANISHED_IMPROVEMENT for t in range(20)}
    assert compare(orig, better, 0, 20, 0).outcome == "vanished"
    assert compare(orig, slightly, 0, 20, 0).outcome == "persisted"
    assert compare(orig, better, 0, 20, 0).late_steps == 5


def _ev(kind: str, step: int, layer: str = "attn.softmax", end: int | None = None):
    from neuraldbg.events.base import Event

    return Event("activation_regime_shift", kind, layer, step, end_step=end)


FLAT = {t: 1.0 for t in range(20)}


def test_symptoms_in_keeps_the_events_a_replay_could_confirm():
    events = [_ev("saturated", 0), _ev("dead", 17), _ev("saturated", 30)]
    # a regime needs `latency` steps to be reported: one starting at 17 is not confirmed by 20
    assert symptoms_in(events, 0, 20, latency=3) == [("activation_regime_shift", "saturated")]
    assert symptoms_in(events, 0, 20, latency=0) == [("activation_regime_shift", "saturated"),
                                                     ("activation_regime_shift", "dead")]
    assert symptoms_in(events, 5, 20, latency=0) == [("activation_regime_shift", "dead")]


def test_symptom_gone_with_an_unchanged_loss_vanished():
    """Regression: oversized query/key weights saturate attention from step 0 while the loss
    trains like a healthy run's; re-initializing them removed every saturation event, yet the
    loss-only outcome read 'persisted' (attention collapse was never confirmed)."""
    symptoms = symptoms_in([_ev("saturated", 0)], 0, 20, latency=3)
    gone = compare(FLAT, dict(FLAT), 0, 20, 0, symptoms=symptoms, replay_events=[])
    assert gone.outcome == "vanished" and (gone.symptoms, gone.symptoms_after) == (1, 0)
    assert gone.improvement == 0.0
    # the same kind at another layer has not vanished, it moved
    moved = compare(FLAT, dict(FLAT), 0, 20, 0, symptoms=symptoms,
                    replay_events=[_ev("saturated", 2, layer="other.softmax")])
    assert moved.outcome == "persisted" and moved.symptoms_after == 1
    # an event of another kind does not count against it
    other = compare(FLAT, dict(FLAT), 0, 20, 0, symptoms=symptoms, replay_events=[_ev("dead", 4)])
    assert other.outcome == "vanished"


def test_symptom_gone_with_a_worse_or_nonfinite_loss_persisted():
    symptoms = [("activation_regime_shift", "saturated")]
    worse = {t: 1.0 + 2 * VANISHED_IMPROVEMENT for t in range(20)}
    c = compare(FLAT, worse, 0, 20, 0, symptoms=symptoms, replay_events=[])
    assert c.outcome == "persisted" and c.improvement < -VANISHED_IMPROVEMENT
    slightly = {t: 1.0 + 0.5 * VANISHED_IMPROVEMENT for t in range(20)}
    assert compare(FLAT, slightly, 0, 20, 0, symptoms=symptoms, replay_events=[]).outcome == "vanished"
    broken = {t: (NAN if t >= 19 else 1.0) for t in range(20)}
    c = compare(FLAT, broken, 0, 20, 0, symptoms=symptoms, replay_events=[])
    assert c.outcome == "persisted" and c.nonfinite_after == 1


def test_without_symptoms_the_loss_alone_decides():
    c = compare(FLAT, dict(FLAT), 0, 20, 0, symptoms=(), replay_events=[])
    assert c.outcome == "persisted" and c.symptoms == 0


def test_a_replay_event_outside_the_window_is_not_a_recurrence():
    symptoms = [("activation_regime_shift", "saturated")]
    assert recurrences(symptoms, [_ev("saturated", 25)], 0, 20) == 0
    assert recurrences(symptoms, [_ev("saturated", 0, end=3)], 2, 20) == 1


def test_reference_gain_reads_the_late_paired_records_after_the_start():
    orig = {0: 1.0, 10: 2.0, 20: 3.0}
    replay = {0: 1.0, 10: 1.0, 20: 1.5}
    assert reference_gain(orig, replay, 0, 25, onset=0) == pytest.approx(0.5)  # only step 20 is late
    assert reference_gain(orig, replay, 0, 20, onset=0) == pytest.approx(0.5)  # step 10, none later
    assert reference_gain(orig, {0: 1.0}, 0, 20, onset=0) is None
    assert reference_gain(orig, replay, 0, 10, onset=0) is None  # the start record is the snapshot's


def test_a_kept_reference_vanishes_the_symptom_even_when_training_slows():
    loss = {t: 1.0 for t in range(20)}
    slower = {t: 1.1 for t in range(20)}  # the lower step size learns the new task more slowly...
    refs = ({0: 1.0, 10: 2.0}, {0: 1.0, 10: 1.2})  # ...and keeps the old one
    c = compare(loss, slower, 0, 20, 0, reference=refs)
    assert c.outcome == "vanished" and c.improvement < -VANISHED_IMPROVEMENT
    assert c.reference_gain == pytest.approx(0.4)
    assert compare(loss, slower, 0, 20, 0).outcome == "persisted"  # without the reference
    same = compare(loss, slower, 0, 20, 0, reference=(refs[0], dict(refs[0])))
    assert same.outcome == "persisted" and same.reference_gain == 0.0


def test_a_reference_kept_only_by_learning_more_slowly_persisted():
    """On a task that overwrites the reference, a lower rate keeps it better by about what it
    costs the task: the ordinary trade of any learning rate, not a step size too large."""
    loss = {t: 1.0 for t in range(20)}
    slower = {t: 1.25 for t in range(20)}  # 20% worse
    refs = ({0: 1.0, 10: 2.0}, {0: 1.0, 10: 1.4})  # 30% better: less than twice the cost
    c = compare(loss, slower, 0, 20, 0, reference=refs)
    assert c.outcome == "persisted" and c.reference_gain == pytest.approx(0.3)
    assert c.reference_gain < REFERENCE_TRADE * -c.improvement + VANISHED_IMPROVEMENT


def test_a_reference_kept_by_a_nonfinite_replay_is_no_fix():
    loss = {t: 1.0 for t in range(20)}
    broken = {t: (1.0 if t < 15 else NAN) for t in range(20)}
    c = compare(loss, broken, 0, 20, 0, reference=({0: 1.0, 10: 2.0}, {0: 1.0, 10: 1.0}))
    assert c.outcome == "persisted" and c.nonfinite_after == 5
