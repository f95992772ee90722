"""The detectors on real (tiny) training runs: each injected fault gives its event, healthy
runs give none. Runs take a fraction of a second to a few seconds each."""
import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.examples import ONSET, train_example


def kinds(dbg):
    return {(e.type, e.kind) for e in dbg.events}


def first(dbg, kind):
    return next(e for e in dbg.events if e.kind == kind)


def first_param_layer(run):
    names = [n for n, m in run.model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    return names[0]


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
@pytest.mark.parametrize("seed", [0, 1])
class TestFaults:
    def test_init_too_small_vanishes_first_at_the_input_side(self, arch, seed):
        r = train_example(arch, "init_too_small", seed, steps=40)
        ev = first(r.dbg, "vanishing")
        assert ev.step == 0 and ev.layer == first_param_layer(r)

    def test_lr_too_high_explodes_or_diverges(self, arch, seed):
        r = train_example(arch, "lr_too_high", seed, steps=40)
        blowups = [e for e in r.dbg.events if e.kind in ("exploding", "divergence")]
        assert blowups
        assert min(e.step for e in blowups) > 0  # not at init: the optimizer blew it up

    def test_nan_batch_is_a_data_anomaly_at_the_first_layer(self, arch, seed):
        r = train_example(arch, "nan_batch", seed, steps=40)
        ev = first(r.dbg, "nan")
        assert (ev.type, ev.layer, ev.step, ev.measured["at_input"]) == (
            "data_anomaly", first_param_layer(r), ONSET, 1.0)

    def test_input_scaled_1000x_is_a_shift_at_onset(self, arch, seed):
        r = train_example(arch, "input_shift", seed, steps=40)
        ev = first(r.dbg, "shift")
        assert ev.step == ONSET and ev.layer == first_param_layer(r)
        assert ev.measured["scale_ratio"] > 100

    def test_biases_at_minus_10_kill_relus(self, arch, seed):
        r = train_example(arch, "dead_relu", seed, steps=40)
        ev = first(r.dbg, "dead")
        assert ev.step == 0 and ev.measured["dead_frac"] >= 0.9

    def test_deep_sigmoid_stack_vanishes_from_init(self, arch, seed):
        r = train_example(arch, "deep_sigmoid", seed, steps=30)
        ev = first(r.dbg, "vanishing")
        assert ev.step == 0 and ev.layer == first_param_layer(r)


def test_saturated_bounded_activations():
    """Large pre-activations pin sigmoid/tanh units at their bounds; Linear outputs never count."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Sigmoid(), nn.Linear(64, 4))
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.Linear):
                m.weight.normal_(0, 3.0)
    gen = torch.Generator().manual_seed(0)
    with NeuralDbg(net) as dbg:
        for _ in range(10):
            x = torch.randn(32, 16, generator=gen)
            net(x).pow(2).mean().backward()
            dbg.record_loss(1.0)
    sat = {e.layer for e in dbg.events if e.kind == "saturated"}
    assert sat == {"1", "3"}


@pytest.mark.parametrize("arch", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("seed", range(5))
def test_healthy_runs_raise_no_events(arch, seed):
    r = train_example(arch, "healthy", seed, steps=300)
    assert r.losses[-1] < 0.8 * r.losses[0]  # it really learns
    assert r.dbg.events == [], [str(e) for e in r.dbg.events]
