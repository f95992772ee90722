import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from neuraldbg.config import DetectorConfig
from neuraldbg.events.gradient import (GradientHealthDetector, exploding_growth, exploding_layers, vanishing_layers,
                                       vanishing_mask)
from neuraldbg.events.registry import DetectorContext
from neuraldbg.events.stepstats import StepStats

CTX = DetectorContext("mlp", ("a", "b", "c"), "a")


def test_vanishing_relative_and_absolute():
    out = vanishing_layers({"a": 1e-6, "b": 1e-2, "c": 2e-2}, abs_floor=1e-7, ratio=1e-3)
    assert set(out) == {"a"} and math.isclose(out["a"], 5e-5)
    assert set(vanishing_layers({"a": 1e-8}, 1e-7, 1e-3)) == {"a"}  # single layer: absolute only
    assert vanishing_layers({"a": 1e-3, "b": 1e-2}, 1e-7, 1e-3) == {}


def test_exploding_growth_absolute_and_infinite():
    base = {"a": 0.01, "b": 0.01}
    assert exploding_layers({"a": 5.0, "b": 0.02}, base, abs_ceiling=10, rel=100, ratio=70, floor=1e-7) == {"a": 500.0}
    assert set(exploding_layers({"a": 20.0}, {}, abs_ceiling=10, rel=100, ratio=70, floor=1e-7)) == {"a"}
    assert exploding_layers({"a": math.inf}, {}, abs_ceiling=10, rel=100, ratio=70, floor=1e-7) == {"a": math.inf}
    # NaN belongs to the data detector; a vanished baseline makes no growth claim
    assert exploding_layers({"a": math.nan, "b": 1.0}, {"b": 1e-9}, abs_ceiling=10, rel=100, ratio=70,
                            floor=1e-7) == {}


def stats(step, rms):
    return StepStats(step=step, has_backward=True,
                     layers={k: {"pgrad_sumsq": v * v * 10, "pgrad_n": 10} for k, v in rms.items()})


def test_detector_baseline_then_explosion():
    det = GradientHealthDetector(DetectorConfig(), CTX)
    for s in range(5):
        assert det.update(stats(s, {"a": 0.01, "b": 0.02, "c": 0.01})) == []
    evs = det.update(stats(5, {"a": 5.0, "b": 0.02, "c": 0.01}))
    assert [(e.kind, e.layer) for e in evs] == [("exploding", "a")]
    assert math.isclose(evs[0].measured["growth"], 500.0, rel_tol=1e-6)


def test_no_backward_no_events():
    det = GradientHealthDetector(DetectorConfig(), CTX)
    assert det.update(StepStats(step=0, layers={"a": {"out_sum": 1.0}})) == []


def test_recovery_from_vanished_init_is_not_exploding():
    """Regression: growth against a vanished warm-up baseline (init x1e-2 under Adam, 1e-7 ->
    8e-6) was reported as exploding, pointing the diagnosis at the learning rate."""
    det = GradientHealthDetector(DetectorConfig(), CTX)
    for s in range(5):
        det.update(stats(s, {"a": 2e-7, "b": 0.02, "c": 0.01}))
    evs = det.update(stats(5, {"a": 8e-5, "b": 0.02, "c": 0.01}))
    assert not [e for e in evs if e.kind == "exploding"]
    # the absolute ceiling still applies to such a layer
    evs = det.update(stats(6, {"a": 50.0, "b": 0.02, "c": 0.01}))
    assert [(e.kind, e.layer) for e in evs] == [("exploding", "a")]


def test_layers_are_followed_by_name_when_the_step_names_change():
    det = GradientHealthDetector(DetectorConfig(), CTX)
    for s in range(5):
        rms = {"a": 0.01, "b": 0.02, "c": 0.01}
        det.update(stats(s, dict(reversed(list(rms.items()))) if s % 2 else rms))
    # a layer missing from a step keeps its baseline; a new layer gets its own
    evs = det.update(stats(5, {"d": 0.02, "a": 5.0}))
    assert [(e.kind, e.layer) for e in evs] == [("exploding", "a")]
    assert math.isclose(evs[0].measured["baseline_rms"], 0.01)


def test_a_layer_without_gradients_is_missing_not_vanished():
    det = GradientHealthDetector(DetectorConfig(), CTX)
    step = StepStats(step=0, has_backward=True, layers={"a": {"pgrad_sumsq": 1e-2, "pgrad_n": 10},
                                                      "b": {"out_sum": 1.0}, "c": {"pgrad_sumsq": 0.0,
                                                                                    "pgrad_n": 10}})
    assert det.update(step) == []  # b has no gradient, c's are exactly zero: neither is an observation


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(1e-12, 1e3), st.just(math.nan), st.just(math.inf)), min_size=1, max_size=6),
       st.lists(st.one_of(st.floats(1e-9, 10.0), st.just(math.nan)), min_size=6, max_size=6))
def test_the_quiet_screen_never_hides_an_event(r, base):
    cfg = DetectorConfig()
    det = GradientHealthDetector(cfg, CTX)
    r = np.array(r)
    trusted = np.array(base[:len(r)])
    if det._quiet(r, np.where(trusted > cfg.vanish_abs, trusted, np.nan)):
        growth = exploding_growth(r, trusted, abs_ceiling=cfg.explode_abs, rel=cfg.explode_rel,
                                  ratio=cfg.explode_ratio, floor=cfg.vanish_abs)
        assert np.isnan(growth).all()
        assert not vanishing_mask(r, cfg.vanish_abs, cfg.vanish_ratio)[0].any()


def _grad_step(step, names, rms, lr):
    """A checked step with one name tuple: gradient RMS per layer (10 elements each), no outputs."""
    k = len(names)
    cols = {"pgrad_sumsq": np.array(rms) ** 2 * 10, "pgrad_n": np.full(k, 10.0), "out_sum": np.zeros(k),
            "out_sumsq": np.full(k, np.nan), "out_n": np.zeros(k), "dead_frac": np.full(k, np.nan),
            "sat_frac": np.full(k, np.nan)}
    s = StepStats(step=step, has_backward=True, names=names, columns=cols,
                  present=(np.zeros(k, dtype=bool), np.ones(k, dtype=bool)))
    s.lr = lr
    return s


class _Uncached(GradientHealthDetector):
    """The detector computing its allowance afresh at every step (the reference for the cache)."""

    def update(self, stats):
        self._allowed = None
        return super().update(stats)


_STEP = st.tuples(st.sampled_from([1e-9, 0.01, 0.01, 0.02, 0.5, 5.0, 50.0, math.inf]),
                  st.sampled_from([0.01, 0.02, 3.0]),
                  st.sampled_from([None, 0.0, 1e-3, 1e-3, 1e-2, 0.1]),
                  st.sampled_from([False] * 9 + [True]))


@settings(max_examples=80, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=30))
def test_kept_allowance_reads_as_computed_each_step(seq):
    """The growth allowance and the still-forming flag kept across steps of one name tuple give the
    events of computing them at every step, through rate changes, baselines forming and a layer
    forgotten (a module swapped mid-run)."""
    names = ("a", "b", "c")  # one tuple, as the monitor's layout gives it: the positions are kept
    kept, fresh = GradientHealthDetector(DetectorConfig(), CTX), _Uncached(DetectorConfig(), CTX)
    for step, (ra, rb, lr, forget) in enumerate(seq):
        got = []
        for det in (kept, fresh):
            if forget:
                det.forget_layer("a")
            got.append([(e.kind, e.layer, e.severity) for e in det.update(_grad_step(step, names, (ra, rb, 0.01), lr))])
        assert got[0] == got[1]


def test_kept_allowance_follows_a_baseline_formed_then_forgotten():
    """The scenario the property above samples, spelled out: the baselines form (the growth
    allowance changes), a rate rise allows more growth, a forgotten layer has no baseline."""
    names = ("a", "b", "c")
    seq = [(0.01, 0.02, 1e-3, False)] * 6 + [(5.0, 0.02, 1e-3, False), (5.0, 0.02, 1e-3, True),
                                             (0.01, 0.02, 1e-3, False), (5.0, 0.02, 1e-1, False)]
    test_kept_allowance_reads_as_computed_each_step.hypothesis.inner_test(seq)
    det = GradientHealthDetector(DetectorConfig(), CTX)
    kinds = []
    for step, (ra, rb, lr, forget) in enumerate(seq):
        if forget:
            det.forget_layer("a")
        kinds.append([e.kind for e in det.update(_grad_step(step, names, (ra, rb, 0.01), lr))])
    # 500x over its baseline fires; with that baseline forgotten (forming again from the next
    # step) only the absolute ceiling applies, at this rate and at a higher one
    assert kinds[6] == ["exploding"] and kinds[7] == [] and kinds[8] == [] and kinds[9] == []
