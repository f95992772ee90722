"""The paired window comparison that decides whether a symptom vanished."""
from __future__ import annotations

import math

import pytest

from neuraldbg.verify.outcome import VANISHED_IMPROVEMENT, compare, late_steps, relative_gain

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
