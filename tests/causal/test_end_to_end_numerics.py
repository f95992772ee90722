"""Real tiny runs where a number leaves its precision: one run per birthplace of the first
non-finite value (input, forward, targets, backward, update), and the ``numerics`` mechanisms
-- an fp16 model under Adam, fp32 Adam with ``eps=0``, bf16 weights at a fine-tuning rate --
with their twins that must not read as numerics (bf16 autocast over fp32 master weights, a NaN
batch). Each run takes a second or two on a CPU."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal import api
from neuraldbg.causal.nodes.numerics import first_nonfinite
from neuraldbg.causal.view import TraceView

D, K, STEPS, AT = 16, 4, 40, 10


class Blow(nn.Module):
    """Multiplies by ``factor`` from step ``AT`` on (a forward that leaves fp32's range)."""

    def __init__(self, factor: float = 1e39):
        super().__init__()
        self.factor, self.on = factor, False

    def forward(self, x):
        return x * self.factor if self.on else x


class NanGrad(torch.autograd.Function):
    """Identity forward; a NaN gradient backward (a backward that leaves the range on its own)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * math.nan


class NanBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.on = False

    def forward(self, x):
        return NanGrad.apply(x) if self.on else x


def net(middle: nn.Module | None = None, out: int = K) -> nn.Sequential:
    return nn.Sequential(nn.Linear(D, 64), nn.ReLU(), middle or nn.Identity(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, out))


def run(origin: str, seed: int = 0):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    middle = Blow() if origin == "forward" else NanBackward() if origin == "backward" else None
    m = net(middle, out=1 if origin == "targets" else K)
    opt = torch.optim.Adam(m.parameters(), 1e-3, eps=0.0 if origin == "update" else 1e-8)
    with NeuralDbg(m, every=1) as dbg:
        for step in range(STEPS):
            x = torch.randn(32, D, generator=gen)
            if origin == "update":
                x[:, D // 2:] = 0.0  # columns whose weights get exactly zero gradients: 0/0 with eps=0
            if middle is not None:
                middle.on = step == AT
            if origin == "input" and step == AT:
                x[0, 0] = math.nan
            if origin == "targets":
                y = x[:, :1].clone()
                if step == AT:
                    y[3] = math.nan
                loss = F.mse_loss(m(x), y)
            else:
                loss = F.cross_entropy(m(x), x[:, :K].argmax(1))
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


@pytest.mark.parametrize("origin,step", [("input", AT), ("forward", AT), ("targets", AT), ("backward", AT),
                                         ("update", 1)])
def test_the_birthplace_of_the_first_nonfinite_value(origin, step):
    """``update``: the first update divides 0 by 0 (eps=0) and the forward after it, at step 1,
    runs on NaN weights."""
    tr = run(origin).trace()
    assert first_nonfinite(TraceView(tr)) == (origin, step)


@pytest.mark.parametrize("origin", ["backward", "update"])
def test_a_nan_the_run_made_is_never_corrupted_data(origin):
    post = api.posterior(run(origin).trace())
    assert post["data"]["corrupted"] == 0.0 and ("data", "corrupted") in post.ruled_out
    assert post["numerics"]["overflow"] > 0.5


def test_a_nan_batch_is_corrupted_data_not_an_overflow():
    post = api.posterior(run("input").trace())
    assert post["numerics"]["overflow"] == 0.0 and post["data"]["corrupted"] > 0.5


def mechanism(kind: str, steps: int = 60, seed: int = 0):
    """A 4-way task on a small MLP: ``fp16`` (``model.half()`` under Adam: eps rounds to 0),
    ``bf16`` (bf16 weights, AdamW 3e-5: the updates round away), ``autocast`` (the same rate,
    fp32 weights, bf16 autocast), ``fp32`` (the same rate in fp32)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    m = net()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(kind, torch.float32)
    m.to(dtype)
    opt = torch.optim.Adam(m.parameters(), 1e-3) if kind == "fp16" else torch.optim.AdamW(m.parameters(), 3e-5)
    with NeuralDbg(m) as dbg:
        for _ in range(steps):
            x = torch.randn(32, D, generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "autocast"):
                out = m(x.to(dtype))
            loss = F.cross_entropy(out.float(), x[:, :K].argmax(1))
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


def top(dbg):
    hs = dbg.explain_failure()
    return hs[0] if hs else None


def test_an_fp16_model_under_adam_overflows_in_its_first_update():
    dbg = mechanism("fp16")
    h = top(dbg)
    assert (h.cause, h.state) == ("numerics", "overflow") and h.probability > 0.9
    assert h.onset_step == 1 and "eps" in h.suggested_fix
    assert api.posterior(dbg.trace())["data"]["corrupted"] == 0.0


def test_bf16_weights_lose_their_updates_and_autocast_keeps_them():
    dbg = mechanism("bf16")
    h = top(dbg)
    assert (h.cause, h.state) == ("numerics", "updates_lost") and h.probability > 0.5
    assert "master weights" in h.suggested_fix and "not the fix" in h.suggested_fix
    twin = api.posterior(mechanism("autocast").trace())
    # fp32 master weights: updates_lost is impossible, and nothing overflowed
    assert twin["numerics"]["updates_lost"] == 0.0 and twin["numerics"]["overflow"] == 0.0
