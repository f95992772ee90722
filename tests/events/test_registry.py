"""The detector registry: which detectors read a step that recorded only its loss."""
from neuraldbg.config import DetectorConfig
from neuraldbg.events.registry import DETECTORS, Detector, DetectorContext, build_detectors, register_detector
from neuraldbg.events.stepstats import StepStats
from tests.tiny import run


def test_a_detector_that_skips_loss_only_steps_returns_nothing_for_them():
    """The monitor leaves out ``update`` where ``reads_loss_only`` is False: that must be a call
    that would have returned no hits, whatever the loss does."""
    ctx = DetectorContext(family="mlp", layer_order=("0", "1"), input_layer="0")
    dets = build_detectors(None, DetectorConfig(), ctx)
    skipping = [d for d in dets if not d.reads_loss_only]
    assert {d.name for d in skipping} == {"data", "activation", "gradient"}
    for d in skipping:
        for step, loss in enumerate([1.0, 1.0, 50.0, float("nan"), float("inf"), 1e9] * 20):
            assert d.update(StepStats(step, loss)) == []
    assert [d.name for d in dets if d.reads_loss_only] == ["loss"]


def test_a_registered_detector_hears_every_step_unless_it_says_otherwise():
    seen = []

    @register_detector("test_counts_steps")
    class CountsSteps(Detector):
        name = "test_counts_steps"

        def update(self, stats):
            seen.append((stats.step, stats.loss is not None, bool(stats.names)))
            return []

    try:
        r = run(steps=12, monitor={"every": 5, "detectors": ["loss", "test_counts_steps"]})
    finally:
        DETECTORS.pop("test_counts_steps")
    assert [s for s, _, _ in seen] == list(range(12))  # unchecked steps included
    assert all(has_loss for _, has_loss, _ in seen)
    assert [s for s, _, checked in seen if checked] == [0, 5, 10]
    assert r.dbg.internal_errors == 0
