import math

import numpy as np
import pytest

from neuraldbg.config import DetectorConfig
from neuraldbg.events.loss import LossInstabilityDetector, is_spike, relative_median_drop, robust_z
from neuraldbg.events.registry import DetectorContext
from neuraldbg.events.stepstats import StepStats


def test_robust_z_matches_hand_computation():
    w = [1, 2, 3, 4, 100]  # median 3, MAD 1
    assert math.isclose(robust_z(5, w), 2 / 1.4826)
    assert robust_z(3, [3, 3, 3]) == 0 and robust_z(4, [3, 3, 3]) == math.inf


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
