from neuraldbg.config import DetectorConfig
from neuraldbg.events.activation import ActivationRegimeDetector, Streak
from neuraldbg.events.registry import DetectorContext
from neuraldbg.events.stepstats import StepStats

CTX = DetectorContext("mlp", ("relu",), "relu")


def test_streak():
    s = Streak()
    assert [s.push(h, i) for i, h in enumerate([True, True, False, True])] == [1, 2, 0, 1]
    assert s.start == 3


def st(step, **d):
    return StepStats(step=step, layers={"relu": {"out_sum": 1.0, **d}})


def test_dead_needs_persistence_and_is_dated_at_the_first_step():
    det = ActivationRegimeDetector(DetectorConfig(regime_persistence=3), CTX)
    out = [det.update(st(s, dead_frac=0.95)) for s in range(4)]
    assert out[0] == out[1] == []
    ev = out[2][0]
    assert (ev.kind, ev.step, ev.end_step, ev.count) == ("dead", 0, 2, 3)
    assert out[3][0].step == 3


def test_one_bad_batch_is_not_an_event():
    det = ActivationRegimeDetector(DetectorConfig(), CTX)
    seq = [0.95, 0.1, 0.95, 0.1, 0.95]
    assert all(det.update(st(s, dead_frac=f)) == [] for s, f in enumerate(seq))


def test_non_finite_outputs_are_not_dead():
    det = ActivationRegimeDetector(DetectorConfig(regime_persistence=1), CTX)
    assert det.update(StepStats(step=0, layers={"relu": {"out_sum": float("nan"), "dead_frac": 1.0}})) == []


def test_saturation_only_where_measured():
    det = ActivationRegimeDetector(DetectorConfig(regime_persistence=1), CTX)
    assert det.update(st(0, sat_frac=0.9))[0].kind == "saturated"
    assert det.update(st(1)) == []  # an unbounded output carries no saturation statistic


def test_a_step_without_the_layer_neither_extends_nor_breaks_its_run():
    det = ActivationRegimeDetector(DetectorConfig(regime_persistence=3), CTX)
    other = StepStats(step=1, layers={"lin": {"out_sum": 1.0}})  # the ReLU did not run
    assert det.update(st(0, dead_frac=0.95)) == [] and det.update(other) == []
    assert det.update(st(2, dead_frac=0.95)) == []
    ev = det.update(st(3, dead_frac=0.95))
    assert [(e.kind, e.step, e.count) for e in ev] == [("dead", 0, 3)]


def test_a_healthy_layer_after_a_run_breaks_it():
    det = ActivationRegimeDetector(DetectorConfig(regime_persistence=2), CTX)
    assert det.update(st(0, dead_frac=0.95)) == []
    assert det.update(st(1, dead_frac=0.1)) == []  # nothing holds, but a run was going on
    assert det.update(st(2, dead_frac=0.95)) == []
    assert [e.step for e in det.update(st(3, dead_frac=0.95))] == [2]
