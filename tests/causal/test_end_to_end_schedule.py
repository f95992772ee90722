"""Real tiny runs whose schedule or optimizer state decides the diagnosis: a ``StepLR`` meant for
epochs stepped every batch (the rate collapses while the loss is near chance), healthy
schedules that must stay quiet (cosine to zero, SGDR), and a checkpoint resumed with and
without its optimizer and scheduler state. A 4-way MLP task; each run takes a few seconds."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal import api
from neuraldbg.causal.fixes import suggested_fix

D, K, STEPS = 8, 4, 150
#: the resume: pre-training steps, and the rate a script re-creates its optimizer at
PRETRAIN, RESUME_LR = 400, 3e-2


def batches(seed):
    gen = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(64, D, generator=gen)
        yield x, x[:, :K].argmax(1)


def model():
    return nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, K))


def train(m, opt, sched, steps, data, dbg=None):
    for step in range(steps):
        x, y = next(data)
        if dbg is not None:
            dbg.step = step
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        if dbg is not None:
            dbg.record_loss(loss)
        opt.step()
        if sched is not None:
            sched.step()


def schedule_run(make_sched, seed=0, lr=3e-3):
    torch.manual_seed(seed)
    m, data = model(), batches(seed)
    opt = torch.optim.Adam(m.parameters(), lr)
    sched = make_sched(opt)
    with NeuralDbg(m) as dbg:
        train(m, opt, sched, STEPS, data, dbg)
    return dbg


def resume_run(restore, seed=0):
    """Pre-train under a cosine over both parts, then resume the weights under a fresh Adam and
    a fresh cosine (back at its peak), or with both states restored."""
    torch.manual_seed(seed)
    m, data = model(), batches(seed)
    pre = torch.optim.Adam(m.parameters(), RESUME_LR)
    pre_sched = torch.optim.lr_scheduler.CosineAnnealingLR(pre, PRETRAIN + STEPS)
    train(m, pre, pre_sched, PRETRAIN, data)
    opt = torch.optim.Adam(m.parameters(), RESUME_LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, PRETRAIN + STEPS)
    if restore:
        opt.load_state_dict(copy.deepcopy(pre.state_dict()))
        sched.load_state_dict(pre_sched.state_dict())
        for g, lr in zip(opt.param_groups, pre_sched.get_last_lr()):
            g["lr"] = lr
    with NeuralDbg(m) as dbg:
        train(m, opt, sched, STEPS, data, dbg)
    return dbg


def top(dbg):
    hs = dbg.get_causal_hypotheses()
    return hs[0] if hs else None


def test_a_step_lr_stepped_per_batch_is_a_learning_rate_too_low_from_its_collapse():
    dbg = schedule_run(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.1))
    ev = api.evidence(dbg.trace())
    assert ev.observed["lr_schedule"] == "collapsed"
    h = top(dbg)
    assert (h.cause, h.state) == ("learning_rate", "too_low") and h.onset_step == 15  # 1e-3 of the peak
    assert "per epoch, not per batch" in h.suggested_fix


@pytest.mark.parametrize("name, make", [
    ("cosine to zero", lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, STEPS)),
    ("SGDR", lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=30)),
])
def test_healthy_schedules_stay_quiet(name, make):
    dbg = schedule_run(make)
    assert api.evidence(dbg.trace()).observed["lr_schedule"] == "steady"
    assert api.posterior(dbg.trace()).p_healthy >= 0.5


def test_a_resume_without_its_optimizer_state_reads_a_shock_at_the_resume():
    dbg = resume_run(restore=False)
    tr = dbg.trace()
    ev = api.evidence(tr)
    assert ev.observed["optimizer_restart"] == "shock"
    assert ev.support["optimizer_restart"][0].step == 0
    net = api.compiled(api.resolve_priors(tr))
    obs = dict(ev.observed)
    p_with = net.posterior(obs)[0]["learning_rate"]["too_high"]
    without = {k: v for k, v in obs.items() if k != "optimizer_restart"}
    p_without = net.posterior(without)[0]["learning_rate"]["too_high"]
    # the reading alone multiplies the odds of a too-high rate by its likelihood ratio (55)
    assert p_with / (1 - p_with) > 20 * p_without / (1 - p_without)
    fix = suggested_fix(tr, ev, "learning_rate", "too_high", None, 0)
    assert "optimizer.load_state_dict" in fix and "scheduler.load_state_dict" in fix


def test_a_resume_with_every_state_stays_healthy():
    dbg = resume_run(restore=True)
    ev = api.evidence(dbg.trace())
    assert ev.observed["optimizer_restart"] == "none"
    assert api.posterior(dbg.trace()).p_healthy >= 0.5


def restart_run(sgdr, seed=2, lr=3e-2):
    """200 steps at Adam 3e-2: a cosine to near zero over the first 100, then either the script
    builds its optimizer state and scheduler again at the peak (a restart on trained weights),
    or SGDR restarts its own cycle there."""
    torch.manual_seed(seed)
    m, data = model(), batches(seed)
    opt = torch.optim.Adam(m.parameters(), lr)
    sched = (torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=100) if sgdr
             else torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100))
    with NeuralDbg(m) as dbg:
        for step in range(200):
            if step == 100 and not sgdr:
                opt.state.clear()
                for g in opt.param_groups:
                    g["lr"] = g["initial_lr"] = lr
                sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100)
            x, y = next(data)
            dbg.step = step
            loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            sched.step()
    return dbg


def test_a_schedule_restarted_on_trained_weights_is_a_jump_and_sgdr_is_not():
    dbg = restart_run(sgdr=False)
    ev = api.evidence(dbg.trace())
    assert ev.observed["lr_schedule"] == "jumped"
    h = top(dbg)
    assert (h.cause, h.state) == ("learning_rate", "too_high") and h.onset_step == 100
    assert "instead of restarting it" in h.suggested_fix
    dbg = restart_run(sgdr=True)
    assert api.evidence(dbg.trace()).observed["lr_schedule"] == "steady"
    assert api.posterior(dbg.trace()).p_healthy >= 0.5
