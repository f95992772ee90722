"""Schedules and resumes as training scripts get them wrong (and right): the ecosystem faults of
the ``lr_schedule`` and ``optimizer_restart`` evidence.

- a ``StepLR`` written for epochs (``step_size`` of a few epochs, ``gamma=0.1``) but stepped
  after every batch: the rate falls 10x every ``step_size`` optimizer steps and sits at 1e-3 of
  its peak after three of them (:func:`per_batch_step_lr`, :func:`collapse_onset`);
- a run resumed from a checkpoint: :func:`pretrain` trains the model first, for
  ``PRETRAIN_FRAC`` of the monitored run, with its own AdamW under the recipe's warm-up and
  cosine over both parts; the monitored run then either starts from those weights alone (a
  fresh AdamW, the schedule back at its peak) or restores the optimizer's state and the
  scheduler's position with ``load_state_dict`` (:func:`restored_scheduler`);
- healthy schedules that must stay quiet: a linear decay to zero (:func:`linear_to_zero`) and
  SGDR's warm restarts (:func:`warm_restarts`, ``CosineAnnealingWarmRestarts``).
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from benchmarks.ecosystem.training import Task, adamw, cosine_lambda, train_unmonitored, warmup_steps

#: epochs-as-steps of the per-batch StepLR: its step_size is this share of the run
STEP_LR_SHARE = 1 / 12
#: pre-training before a resume, as a share of the monitored run's steps: three runs' lengths, so
#: that the checkpoint sits late in its cosine (at 0.15 of the peak rate), where a run that goes
#: on with everything restored is the healthy end of a healthy schedule. Checkpointed at its
#: middle instead (one run's length, 5e-3 and falling), the encoder at its floor clustered loss
#: spikes with its state restored too (5 spikes in 6 steps, a divergence window, on seed 3): the
#: control was unstable on its own rate, not a resume done right
PRETRAIN_FRAC = 3.0
#: the resumes' rate, on the recipe's (pre-training and resumed run alike): 1e-2 for the plain
#: encoder, a rate it converges at from scratch, and one at which a fresh AdamW on its trained
#: weights takes steps that throw it off its floor (at the recipe's 1e-3 it does not)
RESUME_LR_FACTOR = 10.0
#: SGDR's first cycle, as a share of the run (restarts at a quarter, T_mult=1)
SGDR_SHARE = 0.25

#: what the pre-training left for a resume that restores it: optimizer -> (its scheduler, steps)
_CHECKPOINTS: "weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[Any, int]]" = weakref.WeakKeyDictionary()


def step_size_of(steps: int) -> int:
    """The per-batch StepLR's step_size for a run of ``steps``."""
    return max(1, int(steps * STEP_LR_SHARE))


def per_batch_step_lr(opt: torch.optim.Optimizer, warmup: int, steps: int):
    """``StepLR(step_size, gamma=0.1)`` meant for epochs, stepped every batch (no warm-up)."""
    return torch.optim.lr_scheduler.StepLR(opt, step_size=step_size_of(steps), gamma=0.1)


def collapse_onset(steps: int) -> int:
    """The optimizer step from which the per-batch StepLR's rate is at 1e-3 of its peak."""
    return min(steps - 1, 3 * step_size_of(steps))


def linear_to_zero(opt: torch.optim.Optimizer, warmup: int, steps: int):
    """The recipe's warm-up, then a linear decay to exactly zero at the last step."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, 1.0 - (step - warmup + 1) / max(1, steps - warmup))
    return torch.optim.lr_scheduler.LambdaLR(opt, f)


def warm_restarts(opt: torch.optim.Optimizer, warmup: int, steps: int):
    """SGDR: cosine cycles of a quarter of the run, each restarting at the peak rate."""
    return torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=max(2, int(steps * SGDR_SHARE)))


def pretrain(task: Task, opt: torch.optim.Optimizer, steps: int) -> tuple[torch.optim.Optimizer, Any, int]:
    """Train ``task.model`` for ``PRETRAIN_FRAC`` of ``steps`` with its own AdamW under warm-up
    and cosine over the pre-training and the resumed run together; returns that optimizer, its
    scheduler and the steps taken (the checkpoint). ``opt`` (the run's) only gives the rate."""
    n = max(1, int(steps * PRETRAIN_FRAC))
    lr = max(g["lr"] for g in opt.param_groups)
    pre = adamw(task.model, lr)
    sched = torch.optim.lr_scheduler.LambdaLR(pre, cosine_lambda(warmup_steps(n + steps), n + steps))
    train_unmonitored(task, pre, sched, n)
    return pre, sched, n


def resume_weights_only(task: Task, layer: str | None, opt: torch.optim.Optimizer) -> None:
    """Pre-train, then resume from the weights alone: ``opt`` stays fresh (the fault's schedule
    starts back at its peak, ``warmup=False``)."""
    pretrain(task, opt, _steps(task))


def resume_everything(task: Task, layer: str | None, opt: torch.optim.Optimizer) -> None:
    """Pre-train, then restore the optimizer's state into ``opt``
    (``optimizer.load_state_dict``); the scheduler's position follows in :func:`restored_scheduler`."""
    pre, sched, n = pretrain(task, opt, _steps(task))
    opt.load_state_dict(pre.state_dict())
    _CHECKPOINTS[opt] = (sched, n)


def restored_scheduler(opt: torch.optim.Optimizer, warmup: int, steps: int):
    """The pre-training's scheduler restored on ``opt`` with ``scheduler.load_state_dict``."""
    pre_sched, n = _CHECKPOINTS[opt]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_lambda(warmup_steps(n + steps), n + steps))
    sched.load_state_dict(pre_sched.state_dict())
    # building the scheduler set the rates to its step 0; the checkpoint's position is where it stopped
    for g, lr in zip(opt.param_groups, pre_sched.get_last_lr()):
        g["lr"] = lr
    return sched


def _steps(task: Task) -> int:
    """The monitored run's length, which the runner records in ``task.info["steps"]``."""
    return int(task.info.get("steps", 120))
