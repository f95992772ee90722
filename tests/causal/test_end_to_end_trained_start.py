"""Real small runs that do not start from a fresh initialization, or learn only a little.

- a model trained unmonitored at a rate that saturates it, then trained on under the monitor (the
  Lightning resume from a checkpoint written without the callback, without Lightning): nothing of
  its first monitored step is read as its initialization;
- a model trained to its floor, then fine-tuned at a sound Adam rate: a flat loss at the floor
  and a small step are a healthy fine-tune, not a rate too low.

Each run trains a tiny tanh/ReLU MLP on one thread for about a second.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal.evidence import extract
from neuraldbg.causal.nodes.loss import CALM_LOSS

K = 4
CHANCE = math.log(K)
TEACHER = torch.randn(16, K, generator=torch.Generator().manual_seed(1234))
SEEDS = (0, 1)


def batch(gen: torch.Generator, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 16, generator=gen)
    return x, (x @ TEACHER).argmax(dim=1)  # a random linear teacher


def net(act: type[nn.Module] = nn.Tanh) -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), act(), nn.Linear(64, 64), act(), nn.Linear(64, K))


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, gen: torch.Generator,
          dbg: NeuralDbg | None = None) -> float:
    for _ in range(steps):
        x, y = batch(gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if dbg is not None:
            dbg.record_loss(loss)
        opt.step()
    return float(loss.detach())


def init_hypotheses(dbg: NeuralDbg) -> list:
    return [h for h in dbg.get_causal_hypotheses() if h.cause == "initialization"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("how", ["optimizer_state", "at_init"])
def test_a_run_resumed_after_an_unmonitored_blow_up_never_blames_the_initialization(seed, how):
    """Adam at 3.0 for 15 unmonitored steps pins the tanh layers at their bounds and sends the loss
    to 10-20x chance; the monitor then meets saturated layers and a loss far above chance on its
    first step -- a too-large initialization's signature on a fresh run (0.90 before)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=3.0)
    train(model, opt, 15, gen)
    if how == "at_init":  # what the Lightning callback passes on a resume; a fresh optimizer
        opt = torch.optim.Adam(model.parameters(), lr=3.0)
        kwargs = {"at_init": "resumed from a checkpoint at step 15"}
    else:  # the optimizer's state says it
        kwargs = {}
    with NeuralDbg(model, optimizer=opt, **kwargs) as dbg:
        train(model, opt, 100, gen, dbg)
    ev = extract(dbg.trace())
    assert ev.observed["saturation"] == "later"
    assert "loss_start" not in ev.observed and ev.unobserved["loss_start"].startswith("not at initialization")
    assert "init_scale" not in ev.observed
    post = dbg.posterior()
    assert post["initialization"]["ok"] == pytest.approx(1.0)
    assert set(post.ruled_out) >= {("initialization", "too_small"), ("initialization", "too_large")}
    assert not init_hypotheses(dbg)


def floor_then_finetune(seed: int, lr: float) -> NeuralDbg:
    """Adam 3e-3 for 600 unmonitored steps (the loss at 0.04-0.12, chance 1.39), then a fresh
    Adam at ``lr`` for 120 monitored steps."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = net()
    train(model, torch.optim.Adam(model.parameters(), lr=3e-3), 600, gen)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with NeuralDbg(model, optimizer=opt) as dbg:
        train(model, opt, 120, gen, dbg)
    return dbg


@pytest.mark.parametrize("seed", SEEDS)  # 0, 1: flat at the floor (0.04-0.08)
def test_a_fine_tune_at_its_floor_at_a_sound_rate_is_healthy(seed):
    """The loss starts at its floor and stays there while Adam 1e-3 takes small steps: read
    from a fresh start, a flat loss and a small step are a rate too low (0.72, P(healthy) 0.27
    before); at the floor they are a fine-tune with little left to gain."""
    dbg = floor_then_finetune(seed, 1e-3)
    ev = extract(dbg.trace())
    assert dbg.signatures().as_dict().get("started_trained")
    # at its floor the curve is no stall (some seeds still improve it by a third: "decreasing")
    assert ev.observed["loss_pattern"] in (CALM_LOSS, "decreasing") and ev.observed["progress"] == "learning"
    post = dbg.posterior()
    assert post.p_healthy >= 0.5, dbg.get_causal_hypotheses()
    assert all(h.probability < 0.5 for h in dbg.get_causal_hypotheses())


@pytest.mark.parametrize("seed", SEEDS)
def test_a_fresh_run_still_reads_its_first_step(seed):
    """The same tanh MLP with its weights x30, monitored from initialization: the first step's
    saturation and loss are still evidence about the initialization."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = net()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(30.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        train(model, opt, 100, gen, dbg)
    ev = extract(dbg.trace())
    assert ev.observed["saturation"] in ("init", "init_vanishing") and "loss_start" in ev.observed
    top = dbg.get_causal_hypotheses()[0]
    assert (top.cause, top.state) == ("initialization", "too_large")
