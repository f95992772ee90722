"""The transfer: steps queued, moved to the host in batches, packed into a few tensors."""
import math

import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.monitor import transfer as T
from tests.tiny import batches, run, spy_steps


def train(model, steps, dbg, n=16):
    run(model, steps=steps, data=batches(steps, n=n), dbg=dbg)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))


def test_steps_wait_for_sync_every_checked_steps_then_move_together(seen):
    model = mlp()
    with NeuralDbg(model, every=2, sync_every=4) as dbg:
        train(model, 7, dbg)  # checked steps 0, 2, 4, 6: the fourth closes the batch
        assert len(seen) == 7 and not dbg._transfer.pending
        train(model, 3, dbg)
        assert len(seen) == 7 and len(dbg._transfer.pending) == 3
        assert len(dbg.events) == 0 and len(seen) == 10  # a query reads everything first
    assert [st.step for st in seen] == list(range(10))
    assert [bool(st.layers) for st in seen] == [s % 2 == 0 for s in range(10)]
    assert all(st.loss is not None and math.isfinite(st.loss) for st in seen)


def test_unchecked_steps_alone_are_bounded(monkeypatch):
    monkeypatch.setattr(T, "MAX_PENDING", 8)
    model = mlp()
    with NeuralDbg(model, every=1000) as dbg:
        train(model, 20, dbg)
        assert len(dbg._transfer.pending) <= 8


def test_a_queued_checked_step_holds_a_few_stacked_tensors_not_one_per_statistic(seen):
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(8, 8), nn.ReLU())], nn.Linear(8, 3))
    with NeuralDbg(model, every=1, sync_every=4) as dbg:
        train(model, 2, dbg)
        checked = dbg._transfer.pending[-1]
        # the scalars (sums, sums of squares, input, loss) in one tensor; the ReLU maxima in
        # one; one vector of gradient norms per backward pass
        assert len(checked.scalars) == 1 and len(checked.vectors) == 2
        assert checked.n_scalars == checked.scalars[0].numel()
        assert checked.n_vectors == sum(v.numel() for v in checked.vectors)
    # read back: the same statistics as a direct computation would give
    assert all(st.has_out.all() for st in seen)


class Mixed(nn.Module):
    """Held outputs of several shapes and kinds, one measured in its hook (Tanh), a shared one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(8, 8), nn.ReLU())])
        self.wide = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 12), nn.Linear(12, 12), nn.GELU())
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        h = self.blocks(x)
        h = self.blocks[0](h)  # a shared module: its calls add up
        return self.head(self.wide(h))


@pytest.mark.parametrize("every", [1, 2])
def test_block_records_read_the_same_statistics_as_a_record_each(monkeypatch, every):
    """Outputs measured together are recorded as one Block, not one tuple of views each: the
    host reads the same columns."""
    from neuraldbg.monitor import stats as S

    def checked(blocks):
        out = spy_steps(monkeypatch)
        calls = []
        if blocks:
            orig_blocks = S.batched_output_blocks
            monkeypatch.setattr(S, "batched_output_blocks", lambda *a, **k: calls.append(1) or orig_blocks(*a, **k))
        else:
            monkeypatch.setattr(S, "batchable", lambda ys, kind: False)
        model = Mixed()
        with NeuralDbg(model, every=every, sync_every=3) as dbg:
            train(model, 6, dbg)
        monkeypatch.undo()
        return [st for st in out if st.names], dbg, len(calls)

    want, each, n_each = checked(False)
    got, blocked, n_blocked = checked(True)
    assert n_each == 0 and n_blocked >= 2 * len(got)  # the Linear(8, 8) and ReLU groups at least
    assert len(got) == len(want) == 6 // every
    for a, b in zip(got, want):
        assert a.names == b.names and (a.has_out == b.has_out).all() and a.has_out.sum() >= 14
        for col in ("out_sum", "out_sumsq", "dead_frac", "sat_frac", "out_n", "pgrad_sumsq"):
            np_a, np_b = a.cols[col], b.cols[col]
            assert np_a == pytest.approx(np_b, rel=1e-5, nan_ok=True), col
    assert [repr(e) for e in blocked.events] == [repr(e) for e in each.events]
