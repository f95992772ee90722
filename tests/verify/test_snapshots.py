"""Snapshots: off and free by default, bounded over long runs, exact round trips."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal.nodes.causes import INIT_SCALE_LOG10, STEP_RATIO_MEDIAN
from neuraldbg.verify.snapshots import DEFAULT_K, Snapshots, capture, of, restore


def _tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _step(model, opt, step):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


def test_off_by_default_and_free():
    model, opt = _tiny()
    for off in (None, False, 0):
        dbg = NeuralDbg(model, optimizer=opt, snapshots=off)
        assert of(dbg) is None and dbg.snapshot_bytes == 0
    assert of(NeuralDbg(model, optimizer=opt)) is None
    assert of(NeuralDbg(model, optimizer=opt, snapshots=True)).k == DEFAULT_K
    assert of(NeuralDbg(model, optimizer=opt, snapshots=5)).k == 5


@pytest.mark.parametrize("bad", [-1, "yes", 2.5])
def test_bad_values_name_the_valid_ones(bad):
    model, opt = _tiny()
    with pytest.raises(ValueError, match="snapshots must be True, False/None or an int K >= 1"):
        NeuralDbg(model, optimizer=opt, snapshots=bad)


class _FakeMonitor:
    """The context the add-on reads (neuraldbg/lifecycle.py), for driving it without training."""

    def __init__(self, model, opt):
        self.root, self.optimizer = model, opt
        self.settings = SimpleNamespace(scaler=None)
        self.step, self.steps_set_by_loop = 0, True


def test_bounded_over_10k_steps():
    model, opt = _tiny()
    dbg = _FakeMonitor(model, opt)
    snaps = Snapshots(8)
    snaps.enter(dbg)
    one = snaps.nbytes
    sizes = []
    for step in range(1, 10_001):
        snaps.step_started(dbg, step, checked=True)
        sizes.append(len(snaps.ring))
    snaps.exit(dbg, None)
    steps = [s.step for s in snaps.all()]
    assert steps[0] == 0 and max(sizes) <= 8
    assert snaps.spacing == 2048  # the smallest power of two with <= 8 multiples in 1..10000
    assert all(s % snaps.spacing == 0 for s in steps[1:])
    assert 10_000 - steps[-1] < snaps.spacing  # the latest snapshot is never more than d steps old
    assert snaps.nbytes <= 9 * one  # step 0 plus the ring: bounded, whatever the run length
    assert snaps.taken < 8 * 14  # each doubling keeps half: a few snapshots per level, not per step


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("user_steps", [True, False])
def test_snapshot_holds_the_state_before_its_step(user_steps):
    model, opt = _tiny()
    seen = {}
    with NeuralDbg(model, optimizer=opt, snapshots=4) as dbg:
        for step in range(40):
            if user_steps:
                dbg.step = step
            seen[step] = _params(model)
            loss = _step(model, opt, step)
            dbg.record_loss(loss)
            opt.step()
    snaps = of(dbg)
    assert [s.step for s in snaps.all()][0] == 0 and len(snaps.ring) <= 4
    for snap in snaps.all():
        for n, p in seen[snap.step].items():
            assert torch.equal(snap.params[n], p), (snap.step, n)
    assert dbg.snapshot_bytes == snaps.nbytes > 0


def test_capture_restore_round_trip_is_exact():
    model, opt = _tiny()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for step in range(5):
        _step(model, opt, step)
        opt.step()
        sched.step()
    tracked = [(lambda: sched.state_dict(), lambda s: sched.load_state_dict(s))]
    snap = capture(model, opt, None, 5, tracked, full=True)
    rng = torch.get_rng_state()
    ref = (_params(model), {k: {kk: vv.clone() for kk, vv in v.items()} for k, v in opt.state_dict()["state"].items()},
           sched.state_dict()["last_epoch"], torch.rand(3))
    torch.set_rng_state(rng)
    for step in range(5, 9):
        _step(model, opt, step)
        opt.step()
        sched.step()
    model.eval()
    restore(snap, model, opt, None, tracked)
    assert model.training
    for n, p in model.named_parameters():
        assert torch.equal(p, ref[0][n])
    for k, st in opt.state_dict()["state"].items():
        for kk, vv in st.items():
            assert torch.equal(vv, ref[1][k][kk]), (k, kk)
    assert sched.state_dict()["last_epoch"] == ref[2]
    assert torch.equal(torch.rand(3), ref[3])  # the RNG stream continues where it was
    # restoring again gives the same state: the snapshot is not aliased by the optimizer
    _step(model, opt, 9)
    opt.step()
    restore(snap, model, opt, None, tracked)
    for n, p in model.named_parameters():
        assert torch.equal(p, ref[0][n])


def test_snapshots_keep_the_signatures():
    """Regression: with snapshots on, the signatures query asked every add-on for its own
    and failed on the snapshot add-on, so the trace lost its step size and weight scale."""
    model, opt = _tiny()
    with NeuralDbg(model, optimizer=opt, snapshots=True) as dbg:
        for step in range(3):
            dbg.step = step
            loss = _step(model, opt, step)
            dbg.record_loss(loss)
            opt.step()
    sig = dbg.signatures()
    assert INIT_SCALE_LOG10 in sig and STEP_RATIO_MEDIAN in sig
