"""The host side of the transfer (neuraldbg/monitor/layout.py): a layout compiled once per step
structure, a shared module's calls summed and averaged, consecutive steps read together."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from tests.tiny import batches, run, spy_steps


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


class Mixed(nn.Module):
    """ReLUs of two widths, a bounded activation, a softmax and a head: every column a layout fills."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.b = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
        self.soft = nn.Softmax(dim=-1)

    def forward(self, x):
        y = self.b(self.a(x))
        return y + 0.0 * self.soft(y)


def _recorded(monkeypatch, together: bool, steps: int = 13, scaler=None, poison: int | None = None, every: int = 1):
    """Every step's statistics of one seeded run, read in runs (``together``) or a step at a
    time; ``poison``: a step whose input holds a NaN and an Inf."""
    from neuraldbg.monitor import transfer as T

    monkeypatch.undo()
    if not together:
        monkeypatch.setattr(T, "run_key", lambda p: None)
    seen = spy_steps(monkeypatch)
    model = Mixed()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    with NeuralDbg(model, every=every, sync_every=5, scaler=scaler) as dbg:
        for s in range(steps):
            x = torch.randn(4 + s % 3, 8, generator=gen)  # batch sizes change: element counts differ per step
            if s == poison:
                x[0, 0], x[1, 1] = float("nan"), float("inf")
            loss = F.cross_entropy(model(x), torch.randint(0, 3, (len(x),), generator=gen))
            opt.zero_grad()
            (scaler.scale(loss) if scaler is not None else loss).backward()
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            dbg.record_loss(loss)
    monkeypatch.undo()
    return seen, [repr(e) for e in dbg.events]


@pytest.mark.parametrize("case", ["plain", "scaled", "nonfinite", "every2"])
def test_steps_read_together_read_what_one_step_at_a_time_reads(monkeypatch, case):
    """The transfer reads the consecutive steps of one layout together (layout.read_run): every
    column, input, loss and scale is the one-step read's, bit for bit."""
    def kw():
        return {"scaler": torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)} if case == "scaled" else \
            {"poison": 6} if case == "nonfinite" else {"every": 2} if case == "every2" else {}

    alone, events_alone = _recorded(monkeypatch, False, **kw())
    together, events_together = _recorded(monkeypatch, True, **kw())
    assert len(alone) == len(together) == 13
    for a, b in zip(alone, together):
        assert (a.step, a.names, a.has_backward) == (b.step, b.names, b.has_backward)
        assert _same(a.loss, b.loss) and _same(a.grad_scale, b.grad_scale) and _same(a.inputs, b.inputs)
        assert np.array_equal(a.has_out, b.has_out) and np.array_equal(a.has_pgrad, b.has_pgrad)
        assert set(a.cols) == set(b.cols)
        for col in a.cols:
            assert np.array_equal(a.cols[col], b.cols[col], equal_nan=True), (a.step, col)
    assert events_alone == events_together
    if case == "scaled":
        assert all(st.grad_scale is not None for st in together)
    if case == "nonfinite":
        assert together[6].inputs["nan"] == 1 and together[6].inputs["inf"] == 1


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (the sums of a non-finite batch), dicts value by value."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b or (a != a and b != b)


def test_a_run_of_steps_is_read_in_one_go(monkeypatch):
    """At every=1 a transfer of sync_every checked steps reads them as one run."""
    from neuraldbg.monitor import layout as L
    from neuraldbg.monitor import transfer as T

    sizes = []
    orig = L.read_run
    monkeypatch.setattr(T, "read_run", lambda run, *a: sizes.append(len(run)) or orig(run, *a))
    model = mlp()
    with NeuralDbg(model, every=1, sync_every=8) as dbg:
        train(model, 16, dbg)
    assert sizes == [8, 8]
