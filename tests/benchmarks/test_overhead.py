"""The overhead harness (benchmarks/overhead.py): its arms run, and the Cockpit arm fails clearly."""
import importlib.util

import pytest
import torch
from torch.nn import functional as F

from benchmarks import overhead as O


def test_a_classifier_loss_is_the_cross_entropy_of_its_step_batch():
    model, loss_fn = O.MODELS["deep100"](0, "cpu")
    x, y = loss_fn.batch(11)
    assert torch.equal(x, loss_fn.xs[11 % 8]) and torch.equal(y, loss_fn.ys[11 % 8])
    assert torch.equal(loss_fn(model, 11), F.cross_entropy(model(x), y))


@pytest.mark.parametrize("kind", ["monitor", "nullhooks", "onepass"])
def test_paired_blocks_give_one_ratio_per_pair(kind):
    r = O.paired(O.MODELS["deep100"], "sgd", 2, device="cpu", pairs=2, block=2, warmup=1, kind=kind)
    assert len(r["ratios"]) == 2 and all(x > 0 for x in r["ratios"])
    assert r["bare_ms"] > 0 and r["mon_ms"] > 0


def test_the_warm_up_runs_the_monitors_start_up_and_times_it_apart():
    """The start-up (the first checks' extra work, the first transfer that builds the detectors)
    is a one-time cost: the monitored arm warms up until its monitor has made that many checks,
    the bare arm as many steps, and the extra time is reported beside the ratio."""
    r = O.paired(O.MODELS["deep100"], "sgd", 4, device="cpu", pairs=1, block=2, warmup=3, warmup_checks=6)
    # 3 steps, then chunks of 16 until 6 checks (step 0's buffer and steps 4, 8, 12, 16, 20)
    assert r["warmup_steps"] == 3 + O.WARMUP_CHUNK + O.WARMUP_CHUNK
    assert isinstance(r["startup_ms"], float)
    plain = O.paired(O.MODELS["deep100"], "sgd", 4, device="cpu", pairs=1, block=2, warmup=3)
    assert plain["warmup_steps"] == 3  # without warmup_checks: the steps asked for only


def test_the_default_cadence_is_measured_with_every_auto():
    import argparse

    assert O.every_arg("auto") == "auto" and O.every_arg("10") == 10
    for bad in ("0", "fast"):
        with pytest.raises(argparse.ArgumentTypeError, match="an int >= 1 or 'auto'"):
            O.every_arg(bad)
    assert O.every_columns(["auto", 10, 1, 10]) == [1, 10, "auto"]
    r = O.paired(O.MODELS["deep100"], "sgd", "auto", device="cpu", pairs=2, block=2, warmup=1)
    assert len(r["ratios"]) == 2 and r["cadence"].startswith("Checked every step")


def test_the_one_pass_reference_reduces_each_output_once_and_the_gradients_in_one_call():
    from benchmarks.overhead_models import one_pass_gradients, one_pass_hooks
    from neuraldbg.monitor.records import monitored_modules

    model, loss_fn = O.MODELS["mlp"](0, "cpu")
    sink: list = []
    handles = one_pass_hooks(model, sink)
    loss = loss_fn(model, 0)
    assert len(sink) == len(monitored_modules(model))  # one reduction per monitored output
    loss.backward()
    sink.clear()
    params = [p for p in model.parameters() if p.requires_grad]
    one_pass_gradients(params, sink)
    assert [float(n) for n in sink] == pytest.approx([float(p.grad.norm()) for p in params])
    for h in handles:
        h.remove()


@pytest.mark.skipif(importlib.util.find_spec("cockpit") is not None, reason="Cockpit is installed here")
def test_the_cockpit_arm_without_cockpit_says_what_to_install():
    model, loss_fn = O.MODELS["mlp"](0, "cpu")
    with pytest.raises(SystemExit, match="pip install cockpit-for-pytorch"):
        O.cockpit_for(model, loss_fn, 1)


def test_the_cockpit_arm_names_the_models_it_runs_on(monkeypatch):
    """A model that is not one of the plain classifiers is refused by name (checked after the
    imports, so Cockpit's modules are stood in for here)."""
    import sys
    import types

    for name in ("backpack", "cockpit", "cockpit.utils", "cockpit.utils.configuration", "cockpit.utils.schedules"):
        mod = types.ModuleType(name)
        mod.extend = mod.Cockpit = mod.configuration = mod.linear = None
        monkeypatch.setitem(sys.modules, name, mod)
    with pytest.raises(SystemExit, match="--model mlp deep100 deep500"):
        O.cockpit_for(torch.nn.Linear(2, 2), lambda m, i: None, 1)
