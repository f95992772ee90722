import math

import numpy as np
import pytest

from neuraldbg.config import DetectorConfig
from neuraldbg.events.loss import LossInstabilityDetector, is_spike, relative_median_drop, robust_z, trend_z
from neuraldbg.events.registry import DetectorContext
from neuraldbg.events.stepstats import StepStats


def test_robust_z_matches_hand_computation():
    w = [1, 2, 3, 4, 100]  # median 3, MAD 1
    assert math.isclose(robust_z(5, w), 2 / 1.4826)
    assert robust_z(3, [3, 3, 3]) == 0 and robust_z(4, [3, 3, 3]) == math.inf


def test_trend_z_matches_hand_computation():
    # differences 1, 1, 2, 1: median 1, MAD 0; with a 5th: 1, 1, 2, 1, 3 -> MAD 0 still; use noisy ones
    w = [10.0, 9.0, 8.5, 7.0, 6.5, 5.0]  # differences -1, -0.5, -1.5, -0.5, -1.5: median -1, MAD 0.5
    sigma = 0.5 * 1.4826 / math.sqrt(2)
    assert math.isclose(trend_z(8.0, w), (8.0 - 7.0) / sigma)  # the level: median of the last 5 (7.0)
    assert trend_z(3.0, [3.0, 3.0, 3.0]) == 0 and trend_z(4.0, [3.0, 3.0, 3.0]) == math.inf


def test_a_jump_on_a_falling_curve_is_a_spike():
    """Regression: on a window whose loss halved (a curve still learning), the whole-window MAD
    counted the descent as noise, and a jump to 4x the current level scored z 4.4 -- no spike
    (a vocabulary remap on a transformer, its loss 0.5 -> 2.1, read as a healthy run)."""
    w = [0.86, 0.79, 0.75, 0.8, 0.7, 0.72, 0.77, 0.64, 0.65, 0.67, 0.68, 0.59, 0.43, 0.47, 0.49, 0.53, 0.47,
         0.52, 0.62, 0.45]
    assert robust_z(math.log(2.13), [math.log(x) for x in w]) < 6  # the old score
    assert is_spike(2.13, w, 6, 2)[0]
    assert not is_spike(0.7, w, 6, 2)[0]  # back up to where it was a few steps ago: noise


def test_is_spike_needs_outlier_and_ratio():
    w = list(np.linspace(1.0, 1.1, 20))
    assert is_spike(10.0, w, 6, 2)[0]
    assert not is_spike(1.15, w, 6, 2)[0]
    assert not is_spike(float("nan"), w, 6, 2)[0]
    assert is_spike(50.0, [-1.0 + 0.01 * i for i in range(20)], 6, 2)[0]  # negative objectives


def test_relative_median_drop():
    assert math.isclose(relative_median_drop([2.0] * 10 + [1.0] * 10), 0.5)
    assert relative_median_drop([1.0] * 20) == 0.0


def run(losses, family="mlp", **cfg):
    det = LossInstabilityDetector(DetectorConfig(**cfg), DetectorContext(family, (), None))
    return [e for s, l in enumerate(losses) for e in det.update(StepStats(step=s, loss=l))]


def test_decreasing_noisy_loss_is_quiet():
    rng = np.random.default_rng(0)
    losses = 2.0 * np.exp(-np.arange(300) / 80) + 0.05 * rng.random(300)
    assert run(losses) == []


def test_nan_loss_is_divergence():
    evs = run([1.0, 0.9, float("nan")])
    assert [(e.kind, e.step) for e in evs] == [("divergence", 2)]


def test_sustained_growth_is_divergence():
    losses = [1.0] * 10 + [1.0 * 3 ** i for i in range(1, 8)]
    kinds = {e.kind for e in run(losses)}
    assert "divergence" in kinds


def test_spike():
    losses = [1.0 - 0.001 * i for i in range(40)]
    losses[30] = 20.0
    evs = run(losses)
    assert [(e.kind, e.step) for e in evs] == [("spike", 30)]


@pytest.mark.parametrize("family,expected", [("mlp", True), ("gan", False)])
def test_plateau_when_stuck_not_for_adversarial(family, expected):
    rng = np.random.default_rng(1)
    losses = 1.4 + 0.01 * rng.standard_normal(200)
    assert any(e.kind == "plateau" for e in run(losses, family=family)) is expected
