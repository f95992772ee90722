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
