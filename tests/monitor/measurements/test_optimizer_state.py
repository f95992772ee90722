"""The optimizer's state as the run found it (neuraldbg/monitor/measurements/optimizer_state.py):
the pure read on real optimizers, then a monitor entered on a fresh and on a resumed one."""
from __future__ import annotations

import copy

import torch

from neuraldbg.causal.nodes.optimizer_state import OPTIMIZER_STATE_STEPS
from neuraldbg.monitor.measurements.optimizer_state import state_steps
from tiny import mlp, run


def stepped(opt_cls, n, **kw):
    torch.manual_seed(0)
    model = mlp()
    opt = opt_cls(model.parameters(), **kw)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    return model, opt


def test_state_steps_of_fresh_and_stepped_optimizers():
    assert state_steps(stepped(torch.optim.Adam, 0, lr=1e-3)[1]) == 0
    assert state_steps(stepped(torch.optim.AdamW, 7, lr=1e-3)[1]) == 7
    # momentum buffers hold no step count; SGD without momentum holds no state at all
    assert state_steps(stepped(torch.optim.SGD, 3, lr=1e-3, momentum=0.9)[1]) is None
    assert state_steps(stepped(torch.optim.SGD, 3, lr=1e-3)[1]) == 0
    assert state_steps(object()) is None


def test_the_monitor_reads_it_once_for_a_fresh_and_a_restored_optimizer():
    fresh = run(optimizer=torch.optim.Adam, lr=1e-3, steps=6, monitor={"optimizer": True})
    assert fresh.dbg.signatures().number(OPTIMIZER_STATE_STEPS) == 0
    model, pre = stepped(torch.optim.Adam, 5, lr=1e-3)

    def restored(params, lr):
        opt = torch.optim.Adam(params, lr=lr)
        opt.load_state_dict(copy.deepcopy(pre.state_dict()))  # its step tensors would be stepped in place
        return opt

    for given in (True, False):  # given on entry, or found at its first step
        r = run(model, optimizer=restored, lr=1e-3, steps=6, monitor={"optimizer": True} if given else {})
        assert r.dbg.signatures().number(OPTIMIZER_STATE_STEPS) == 5
