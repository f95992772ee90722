"""The schedule measurement (neuraldbg/monitor/measurements/schedule.py): the pure reading on
hand-written rates, then real optimizers and schedulers, found or given."""
from __future__ import annotations

import math

import torch

from neuraldbg import NeuralDbg
from neuraldbg.causal.nodes.run import LR_PEAK
from neuraldbg.causal.nodes.schedule import LR_CHECKED, LR_FIRST, LR_LAST, LR_WARMUP_STEPS
from neuraldbg.monitor.measurements.schedule import ScheduleReading, group_lrs, read_schedule
from tiny import batches, mlp


def test_read_schedule_of_a_linear_warm_up_then_decay():
    lrs = [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0), (5, 0.9), (6, 0.5)]
    assert read_schedule(lrs) == ScheduleReading(first=0.0, peak=1.0, warmup_steps=4, last=0.5, n=7)


def test_read_schedule_of_a_constant_rate_and_of_checked_steps_every_10():
    assert read_schedule([(0, 3e-3)] * 1 + [(10, 3e-3), (20, 3e-3)]) == ScheduleReading(3e-3, 3e-3, 0, 3e-3, 3)
    # a float schedule lands a hair below its peak: 99% of it counts as reached
    assert read_schedule([(5, 0.1), (15, 0.995), (25, 1.0)]).warmup_steps == 10
    assert read_schedule([]) is None


def test_group_lrs_reads_host_floats_and_refuses_a_tensor_rate():
    p = torch.nn.Parameter(torch.zeros(2))
    assert group_lrs(torch.optim.SGD([{"params": [p], "lr": 0.1}, {"params": [], "lr": 1}])) == [0.1, 1.0]
    assert group_lrs(torch.optim.Adam([p], lr=torch.tensor(0.01))) is None
    assert group_lrs(object()) is None


def train(opt_fn, sched_fn=None, *, steps=12, every=1, give=True):
    torch.manual_seed(0)
    model = mlp()
    opt = opt_fn(model.parameters())
    sched = sched_fn(opt) if sched_fn else None
    with NeuralDbg(model, optimizer=opt if give else None, every=every) as dbg:
        for x, y in batches(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            if sched:
                sched.step()
    return dbg.signatures()


def warm(opt, n=4):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / n))


def test_a_warm_up_is_read_from_the_optimizer_found_or_given():
    for give in (True, False):
        sigs = train(lambda p: torch.optim.Adam(p, lr=1e-2), warm, give=give)
        assert sigs.number(LR_FIRST) == 1e-2 / 4 and sigs.number(LR_WARMUP_STEPS) == 3
        assert sigs.number(LR_PEAK) == 1e-2 and sigs.number(LR_CHECKED) == 12


def test_no_warm_up_and_a_decay_and_checked_steps_only():
    sigs = train(lambda p: torch.optim.SGD(p, lr=0.1),
                 lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=6, gamma=0.1), every=3)
    assert sigs.number(LR_FIRST) == 0.1 and sigs.number(LR_WARMUP_STEPS) == 0
    assert abs(sigs.number(LR_LAST) - 0.01) < 1e-12 and sigs.number(LR_CHECKED) == 4  # steps 0, 3, 6, 9


def test_a_tensor_learning_rate_is_not_read_and_says_why():
    sigs = train(lambda p: torch.optim.Adam(p, lr=torch.tensor(1e-2)))
    assert sigs.number(LR_FIRST) is None
    assert "tensor" in sigs.gap(LR_FIRST)


# ---- the course over the whole run: collapse and jumps --------------------------------------

def course(lrs):
    from neuraldbg.monitor.measurements.schedule import CourseTracker

    t = CourseTracker()
    for step, lr in enumerate(lrs):
        t.add(step, lr)
    return t


def test_a_per_batch_step_lr_collapses_at_its_third_decay_and_stays():
    t = course([0.1 * 0.1 ** (s // 10) for s in range(60)])
    assert t.collapse_step == 30 and t.jumps == []   # 1e-4 <= 1e-3 x 0.1 from step 30 on


def test_a_decay_to_zero_collapses_only_at_its_end_and_a_return_resets_it():
    cos = [0.5 * (1 + math.cos(math.pi * s / 100)) for s in range(101)]
    assert course(cos).collapse_step == 98
    assert course([1.0, 1e-4, 1e-4, 1.0]).collapse_step is None


def test_warm_up_is_no_jump_but_a_restart_after_a_decay_is():
    assert course([0.0, 0.25, 0.5, 1.0, 1.0]).jumps == []                 # a ramp from the first step
    assert course([0.01] * 5 + [0.1] * 5).jumps == []                     # a low constant phase, then the peak
    t = course([1.0, 0.5, 0.1, 0.02, 0.005, 1.0, 0.5])                    # decayed, then back at the peak
    assert t.jumps == [5] and t.jump_factor == 200.0
    assert course([1.0, 0.5, 0.3, 1.0]).jumps == []                       # 3.3x: no jump


def test_the_monitor_reads_a_per_batch_step_lr_and_sgdr():
    from neuraldbg.causal.nodes.schedule import LR_COLLAPSE_STEP, LR_JUMP_STEPS

    sigs = train(lambda p: torch.optim.Adam(p, lr=1e-2),
                 lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.1), steps=15)
    # the loop records its loss before stepping, so the monitor counts each update in the next step:
    # the rate of update 9 (1e-2 x 1e-3) is read at step 10
    assert sigs.number(LR_COLLAPSE_STEP) == 10 and sigs.value(LR_JUMP_STEPS) == ()
    sigs = train(lambda p: torch.optim.Adam(p, lr=1e-2),
                 lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=5), steps=15)
    assert sigs.number(LR_COLLAPSE_STEP) is None and sigs.value(LR_JUMP_STEPS) == (6, 11)
