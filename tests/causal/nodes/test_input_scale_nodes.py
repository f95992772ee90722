"""The input-scale evidence node and what it explains away: the step size under SGD."""
from __future__ import annotations

import pytest

from neuraldbg.causal.evidence import extract
from neuraldbg.causal.nodes import causes as G
from neuraldbg.causal.nodes.data import INPUT_NORMALIZED_AT, INPUT_OFF_SCALE, INPUT_RMS_FIRST, INPUT_RMS_MAX
from neuraldbg.causal.nodes.run import OPTIMIZER
from neuraldbg.trace import LayerInfo
from tests.tiny import make_trace

LAYERS = (LayerInfo("fc1", "Linear", 0, 10), LayerInfo("act", "ReLU", 1, 0), LayerInfo("fc2", "Linear", 2, 10))


def evidence(sigs):
    return extract(make_trace((), LAYERS, [1.0] * 20, sigs=sigs, steps=20))


def test_input_scale_reads_large_naming_the_features():
    ev = evidence({INPUT_RMS_MAX.name: 128.0, INPUT_OFF_SCALE.name: "1 of 8 features: fc1[5] rms 128"})
    assert ev.observed["input_scale"] == "large" and "fc1[5]" in ev.notes["input_scale"]
    assert evidence({INPUT_RMS_MAX.name: 1.3}).observed["input_scale"] == "normal"


def test_input_scale_unobserved_behind_a_normalization_layer():
    ev = evidence({INPUT_NORMALIZED_AT.name: "norm"})
    assert "input_scale" not in ev.observed and "norm" in ev.unobserved["input_scale"]


@pytest.mark.parametrize("name,invariant", [("Adam", True), ("AdamW", True), ("RMSprop", True), ("Adafactor", True),
                                            ("Lion", True), ("SGD", False), (None, False)])
def test_scale_invariant_optimizers(name, invariant):
    assert G.scale_invariant(name) is invariant


def test_large_sgd_steps_on_an_off_scale_input_are_no_learning_rate_reading():
    large = {G.STEP_RATIO_MEDIAN.name: 0.5, G.STEP_RATIO_MAX.name: 0.9}
    ev = evidence({**large, OPTIMIZER.name: "SGD", INPUT_RMS_MAX.name: 200.0})
    assert "step_size" not in ev.observed and "off-scale" in ev.unobserved["step_size"]
    # on a unit-scale input, or under Adam (whose step ignores the gradient's scale), it reads
    assert evidence({**large, OPTIMIZER.name: "SGD", INPUT_RMS_MAX.name: 1.0}).observed["step_size"] == "large"
    assert evidence({**large, OPTIMIZER.name: "Adam", INPUT_RMS_MAX.name: 200.0}).observed["step_size"] == "large"
    # small steps are no inflation: they still read
    small = {G.STEP_RATIO_MEDIAN.name: 1e-5, G.STEP_RATIO_MAX.name: 2e-5}
    assert evidence({**small, OPTIMIZER.name: "SGD", INPUT_RMS_MAX.name: 200.0}).observed["step_size"] == "tiny"


def test_no_shift_against_an_off_scale_warm_up_is_no_evidence():
    """The bug this pins: inputs off-scale from step 0 read data_shift "absent" (no shift against
    their own warm-up), which counted against data=shifted."""
    ev = evidence({INPUT_RMS_MAX.name: 128.0, INPUT_RMS_FIRST.name: 128.0})
    assert "data_shift" not in ev.observed and "first step" in ev.unobserved["data_shift"]
    # off-scale only later: the warm-up was sane, so "no shift" is a reading
    assert evidence({INPUT_RMS_MAX.name: 128.0, INPUT_RMS_FIRST.name: 1.0}).observed["data_shift"] == "absent"
