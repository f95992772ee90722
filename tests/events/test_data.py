import math

from neuraldbg.config import DetectorConfig
from neuraldbg.events.data import DataAnomalyDetector, first_nonfinite_layer, shift_score
from neuraldbg.events.registry import DetectorContext
from neuraldbg.events.stepstats import StepStats

CTX = DetectorContext("mlp", ("in", "mid", "out"), "in")


def st(step, inputs=None, outs=None):
    outs = outs or {"in": 1.0, "mid": 1.0, "out": 1.0}
    inputs = inputs or {"sum": 0.0, "sumsq": 100.0, "nan": 0, "inf": 0, "n": 100}
    return StepStats(step=step, inputs=inputs, layers={k: {"out_sum": v} for k, v in outs.items()})


def test_first_nonfinite_layer_follows_forward_order():
    s = st(0, outs={"in": 1.0, "mid": math.inf, "out": math.nan})
    assert first_nonfinite_layer(s, CTX.layer_order) == ("mid", "inf")


def test_shift_score():
    assert shift_score(0.0, 1000.0, 0.0, 1.0) == (1000.0, 0.0)
    assert shift_score(5.0, 1.0, 0.0, 1.0) == (1.0, 5.0)


def test_nan_at_input_then_poisoned_weights_is_one_episode():
    det = DataAnomalyDetector(DetectorConfig(), CTX)
    e1 = det.update(st(3, inputs={"sum": 0.0, "sumsq": 1.0, "nan": 1, "inf": 0, "n": 100},
                       outs={"in": math.nan, "mid": math.nan, "out": math.nan}))
    e2 = det.update(st(4, outs={"in": math.nan, "mid": math.nan, "out": math.nan}))
    assert [(e.kind, e.layer, e.measured["at_input"]) for e in e1 + e2] == [("nan", "in", 1.0)] * 2


def test_nan_born_inside():
    det = DataAnomalyDetector(DetectorConfig(), CTX)
    ev = det.update(st(0, outs={"in": 1.0, "mid": math.nan, "out": math.nan}))
    assert [(e.kind, e.layer, e.measured["at_input"]) for e in ev] == [("nan", "mid", 0.0)]


def test_shift_after_reference():
    cfg = DetectorConfig()
    det = DataAnomalyDetector(cfg, CTX)
    n_ref = cfg.shift_skip_checks + cfg.warmup_checks
    for s in range(n_ref + 5):
        assert det.update(st(s)) == []
    ev = det.update(st(99, inputs={"sum": 0.0, "sumsq": 100.0 * 1e6, "nan": 0, "inf": 0, "n": 100}))
    assert [(e.kind, e.step) for e in ev] == [("shift", 99)]
    assert math.isclose(ev[0].measured["scale_ratio"], 1000.0)
