"""The loss kind told from the gradient into the model's output (no loss graph needed)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.monitor.measurements import losskind as L


def test_row_sum_share_on_hand_computed_gradients():
    # rows summing to zero along the class dimension: share 0
    g = torch.tensor([[0.2, -0.1, -0.1], [-0.5, 0.25, 0.25]])
    assert L.row_sum_share(g).item() == pytest.approx(0.0, abs=1e-7)
    # one row sums to 0.3 out of |g| = 0.3 + 1.0: share 0.3 / 1.3 (dim 1 is the only class dim)
    g = torch.tensor([[0.1, 0.1, 0.1], [-0.5, 0.25, 0.25]])
    assert L.row_sum_share(g).item() == pytest.approx(0.3 / 1.3)
    # a segmentation-like [B, C, H] gradient summing to zero over dim 1, not over dim 2
    g = torch.tensor([[[1.0, 2.0], [-1.0, -2.0]]])
    assert L.row_sum_share(g).item() == pytest.approx(0.0)
    assert math.isnan(L.row_sum_share(torch.zeros(2, 3)).item())


def test_kind_from_shares_and_the_dtype_cut():
    cut = L.share_cut(torch.float32)
    assert cut == L.ZERO_SHARE
    assert L.share_cut(torch.bfloat16) == pytest.approx(3 * 2 ** -7)
    assert L.kind_from_shares([1e-7, 2e-6], cut) is True
    assert L.kind_from_shares([0.3, 0.2], cut) is False
    assert L.kind_from_shares([1e-7, 0.3], cut) is None      # mixed: undecided
    assert L.kind_from_shares([5e-3], cut) is None          # between the cut and 10x: undecided
    assert L.kind_from_shares([float("nan")], cut) is None
    bf16 = L.share_cut(torch.bfloat16)  # 0.023: a bf16 U-Net's MSE shares 0.27..0.33 are still clear
    assert L.kind_from_shares([0.27, 0.33], bf16) is False
    assert L.kind_from_shares([2e-3, 3e-3], bf16) is True


def test_real_losses_give_their_kind():
    z = torch.randn(16, 5, requires_grad=True)
    y = torch.randint(0, 5, (16,))
    shares = {}
    for name, loss in {
        "ce": lambda: F.cross_entropy(z, y),
        "ce_smoothed": lambda: F.cross_entropy(z, y, label_smoothing=0.1),
        "ce_ignored": lambda: F.cross_entropy(z, torch.where(y > 2, -100, y)),
        "mse": lambda: F.mse_loss(z, torch.randn(16, 5)),
        "l1": lambda: F.l1_loss(z, torch.randn(16, 5)),
        "bce": lambda: F.binary_cross_entropy_with_logits(z, torch.rand(16, 5)),
    }.items():
        z.grad = None
        loss().backward()
        shares[name] = L.row_sum_share(z.grad).item()
    cut = L.share_cut(torch.float32)
    assert all(shares[k] < cut for k in ("ce", "ce_smoothed", "ce_ignored")), shares
    assert all(shares[k] > L.CLEAR_FACTOR * cut for k in ("mse", "l1", "bce")), shares


def _run(loss_fn, record, k=4, steps=12, model=None):
    g = torch.Generator().manual_seed(0)
    model = model or nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, k))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            x = torch.randn(32, 6, generator=g)
            loss = loss_fn(model(x), x, g)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(record(loss))
            opt.step()
    return dbg


def _ce(out, x, g):
    return F.cross_entropy(out, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())


def _mse(out, x, g):
    return F.mse_loss(out, x[:, :4] + 0.1 * torch.randn(32, 4, generator=g))


@pytest.mark.parametrize("record", [lambda l: l.item(), lambda l: l.detach()], ids=["item", "detached"])
def test_a_regression_recorded_as_a_number_has_no_chance_level(record):
    """Regression: a K-output regression whose loss reached ``record_loss`` as ``loss.item()`` or
    ``loss.detach()`` (no graph: the kind read "unknown") was read against chance level ln K."""
    sigs = _run(_mse, record).trace().signatures.as_dict()
    assert "out_features" not in sigs


@pytest.mark.parametrize("record", [lambda l: l.item(), lambda l: l.detach()], ids=["item", "detached"])
def test_a_classifier_recorded_as_a_number_keeps_its_chance_level(record):
    dbg = _run(_ce, record)
    assert dbg.trace().signatures.as_dict().get("out_features") == 4
    from neuraldbg.monitor.context import PartContext

    assert PartContext(dbg).loss_is_cross_entropy is True


class _WithLoss(nn.Module):
    """A model that computes its loss in its forward and returns it, as a transformers model does."""

    def __init__(self, regression: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
        self.regression = regression

    def forward(self, x):
        logits = self.net(x)
        loss = F.mse_loss(logits, x[:, :4]) if self.regression else _ce(logits, x, None)
        return SimpleNamespace(loss=loss, logits=logits)


@pytest.mark.parametrize("regression", [False, True])
def test_a_loss_returned_by_the_forward_is_read_from_its_graph(regression):
    model = _WithLoss(regression)
    dbg = _run(lambda out, x, g: model(x).loss, lambda l: l.item(), model=model)
    assert ("out_features" in dbg.trace().signatures.as_dict()) is (not regression)


def test_the_witness_leaves_training_unchanged_and_its_hook_goes():
    def train(monitor):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        dbg = NeuralDbg(model) if monitor else None
        if dbg is not None:
            dbg.__enter__()
        for _ in range(10):
            x = torch.randn(32, 6, generator=g)
            loss = _ce(model(x), x, g)
            opt.zero_grad()
            loss.backward()
            if dbg is not None:
                dbg.record_loss(loss.item())
            opt.step()
        if dbg is not None:
            dbg.__exit__(None, None, None)
        return model
    bare, watched = train(False), train(True)
    assert all(torch.equal(a, b) for a, b in zip(bare.parameters(), watched.parameters()))
    assert not watched._forward_hooks and not watched._forward_pre_hooks


def test_output_tensor_of_library_outputs():
    """Regression: a diffusers ``UNet2DOutput`` (a mapping, not a tuple) gave no output tensor, so
    the U-Net's noise MSE stayed "unknown" and was read against ln 16."""
    from collections import OrderedDict

    pred, loss = torch.ones(2, 3), torch.tensor(1.0)
    assert L.output_tensor(pred) is pred
    assert L.output_tensor((pred, None)) is pred
    assert L.output_tensor(OrderedDict(sample=pred)) is pred
    assert L.output_tensor(OrderedDict(loss=loss, logits=pred), loss) is pred
    assert L.output_tensor(OrderedDict(loss=loss, hidden=pred), loss) is pred
    assert L.output_tensor("text") is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_cross_entropy_shares_sit_under_the_dtype_cut(dtype):
    """The cut follows the gradient's dtype: a bf16 or fp16 cross-entropy's row sums are rounding,
    not signal (measured up to 3e-3 in bf16)."""
    g = torch.Generator().manual_seed(0)
    for k in (2, 16, 1000):
        z = (torch.randn(32, k, generator=g) * 3).to(dtype).requires_grad_()
        F.cross_entropy(z, torch.randint(0, k, (32,), generator=g)).backward()
        assert L.row_sum_share(z.grad).item() < L.share_cut(dtype)
