"""The host side of the transfer (neuraldbg/monitor/layout.py): a layout compiled once per step
structure, a shared module's calls summed and averaged."""
import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg
from tests.tiny import batches, run


def train(model, steps, dbg, n=16):
    run(model, steps=steps, data=batches(steps, n=n), dbg=dbg)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))


def test_a_repeated_step_structure_is_compiled_once():
    model = mlp()
    with NeuralDbg(model, sync_every=1) as dbg:
        train(model, 30, dbg)
        assert len(dbg._transfer._layouts) == 1
        train(model, 5, dbg, n=4)  # a smaller batch: same structure, new element counts
        assert len(dbg._transfer._layouts) == 1


class Shared(nn.Module):
    """One Linear and one ReLU applied twice: their statistics add up over the calls."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.ReLU()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        a = self.act(self.lin(x))
        b = self.act(self.lin(a) - 100.0)  # the second call is entirely dead
        return self.head(a + b)


def test_a_shared_module_sums_its_calls_and_averages_fractions(seen):
    model = Shared()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=gen)
    with torch.no_grad():  # the two calls' outputs, computed before the monitor
        y1 = model.lin(x)
        a = torch.relu(y1)
        y2 = model.lin(a)
        dead1 = 1.0 - (a.amax(dim=0) > 0).float().mean().item()
    with NeuralDbg(model) as dbg:
        model(x).sum().backward()
        dbg.record_loss(1.0)
    lin, act = seen[0].layers["lin"], seen[0].layers["act"]
    assert lin["out_n"] == 2 * 16 * 8
    assert lin["out_sum"] == pytest.approx(float(y1.sum() + y2.sum()), rel=1e-5)
    assert lin["out_sumsq"] == pytest.approx(float(y1.pow(2).sum() + y2.pow(2).sum()), rel=1e-5)
    assert act["dead_frac"] == pytest.approx((dead1 + 1.0) / 2)
    assert "out_sumsq" not in act  # a module owning no parameters: nothing reads its RMS
