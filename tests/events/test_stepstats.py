"""The per-step statistics' helpers (``neuraldbg/events/stepstats.py``)."""
from __future__ import annotations

import numpy as np

from neuraldbg.events.stepstats import LayerIndex, StepStats


def test_layer_positions_stay_right_when_steps_alternate_structures():
    # a large model's outputs are read in rotating shares: its steps alternate a few name tuples,
    # each mapped once and then looked up (positions never move once given)
    idx = LayerIndex()
    a, b = ("x", "y", "z"), ("y", "w")
    first_a = idx.of(a)
    assert first_a.tolist() == [0, 1, 2] and idx.of(b).tolist() == [1, 3]
    assert idx.of(a) is first_a and idx.of(b).tolist() == [1, 3]  # kept, not mapped again
    same_names = tuple(["x", "y", "z"])  # an equal tuple of another identity: mapped, same positions
    assert idx.of(same_names).tolist() == [0, 1, 2]
    for k in range(LayerIndex.KEEP + 3):  # many structures: the cache is bounded, positions hold
        idx.of(("x", f"n{k}"))
    assert np.array_equal(idx.of(b), [1, 3]) and idx.get("n0") == 4 and len(idx) == 4 + LayerIndex.KEEP + 3


def test_grads_finite_agrees_with_the_named_nonfinite_layers():
    # the cheap test (a bool, no names) and the list read the same gradients: a layer without
    # gradients this step, or with none of its elements, is no observation for either
    layers = {"a": {"pgrad_sumsq": 1.0, "pgrad_n": 4.0}, "b": {"pgrad_sumsq": float("inf"), "pgrad_n": 0.0},
              "c": {"out_sum": 1.0, "out_sumsq": 1.0, "out_n": 2.0}}
    st = StepStats(step=3, layers=layers)
    assert st.grads_finite() and st.nonfinite_grad_layers() == []
    for bad in (float("nan"), float("inf")):
        st = StepStats(step=3, layers={**layers, "d": {"pgrad_sumsq": bad, "pgrad_n": 8.0}})
        assert not st.grads_finite() and st.nonfinite_grad_layers() == ["d"]
