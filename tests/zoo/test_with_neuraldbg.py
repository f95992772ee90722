"""Every architecture trains inside the real NeuralDbg. Runs only; diagnosis is tested elsewhere."""
from __future__ import annotations

import math

import pytest

import models
import neuraldbg  # a broken monitor must fail these tests, not skip them
from zoo_testing import fresh_run


def _same(a, b):
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("arch", models.architectures())
def test_monitored_run_returns_dbg_and_same_losses(arch):
    steps = 24
    inj = "data_nan" if "data_nan" in models.injection_names(arch) else "nan_softmax"
    bare = fresh_run(arch, inj, 0, steps)
    r = fresh_run(arch, inj, 0, steps, monitor=True)
    assert isinstance(r.dbg, neuraldbg.NeuralDbg)
    assert r.onset is not None and r.first_nonfinite_step is not None
    assert _same(r.losses, bare.losses), "the monitor changed what training computed"
    r.dbg.posterior()  # the queries answer after the with block


def test_monitor_kwargs_reach_neuraldbg():
    r = fresh_run("mlp", "healthy", 0, 4, monitor={"family": "cnn"})
    assert r.dbg.family == "cnn"


@pytest.mark.parametrize("injection", ["zero_grad_missing", "optimizer_misses_layer", "layer_detached",
                                       "softmax_before_ce"])
def test_loop_bugs_are_named_with_a_found_optimizer(injection):
    """The zoo's loop bugs on the MLP: the runner hands the monitor no optimizer, the monitor
    finds it, and the top hypothesis is the injected ``training_loop`` state."""
    r = fresh_run("mlp", injection, 0, 60, monitor=True)
    assert r.dbg.optimizer is not None  # found through the optimizer step hooks
    top = r.dbg.get_causal_hypotheses()[0]
    assert (top.cause, top.state) == r.truth
    if r.layer is not None:
        assert top.origin_layer == r.layer
