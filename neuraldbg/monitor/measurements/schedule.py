"""The learning-rate schedule as the optimizer applied it: its start, its peak, its decay.

The ``warmup`` evidence (``neuraldbg/causal/nodes/schedule.py``) needs to know whether the rate
started low and rose to its peak. The step size reads each step's rate but divides it out; this
measurement keeps the rates themselves: on each checked step of the primary optimizer, before
the update, the largest ``lr`` over its ``param_groups`` (host floats only: a tensor learning
rate is not read, reading it would sync, and the schedule is then unknown). Schedulers of every
kind (``torch.optim.lr_scheduler``, ``transformers``' warm-up schedules, Lightning's) write the
rate into ``param_groups``, so it needs no access to the scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from neuraldbg.causal.nodes.schedule import LR_CHECKED, LR_FIRST, LR_LAST, LR_WARMUP_STEPS
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement

#: a rate within this share of the peak has reached it (float schedules land a hair below)
AT_PEAK = 0.99


@dataclass(frozen=True)
class ScheduleReading:
    """The schedule read from ``(step, lr)`` pairs: the first rate, the peak, the steps from the
    first pair to the first one at the peak, the last rate, and how many pairs."""

    first: float
    peak: float
    warmup_steps: int
    last: float
    n: int


def read_schedule(lrs: Sequence[tuple[int, float]]) -> ScheduleReading | None:
    """The schedule of checked steps ``(step, lr)`` in step order (``None`` for no pair). Pure."""
    if not lrs:
        return None
    peak = max(lr for _, lr in lrs)
    start = lrs[0][0]
    at = next(s for s, lr in lrs if lr >= AT_PEAK * peak)
    return ScheduleReading(first=lrs[0][1], peak=peak, warmup_steps=at - start, last=lrs[-1][1], n=len(lrs))


def group_lrs(optimizer: Any) -> list[float] | None:
    """Each param group's learning rate as a host float, or ``None`` when one is not a plain
    number (a tensor learning rate: reading it would sync) or there is none."""
    lrs = []
    for g in getattr(optimizer, "param_groups", ()):
        lr = g.get("lr")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)):
            return None
        lrs.append(float(lr))
    return lrs or None


@register_measurement
class Schedule(Measurement):
    """The primary optimizer's learning rate on checked steps (see the module docstring).

    The first :attr:`WINDOW` pairs are kept (a warm-up shows at the start); after them only the
    peak, the step it was reached at and the last rate, so memory stays bounded on long runs.
    """

    signatures = (LR_FIRST, LR_WARMUP_STEPS, LR_LAST, LR_CHECKED)
    unchecked = ()  # the rate is read on checked steps only
    #: checked steps whose ``(step, lr)`` is kept in full
    WINDOW = 64

    def __init__(self) -> None:
        self._lrs: list[tuple[int, float]] = []
        self._peak: tuple[int, float] | None = None  # (step, lr) of the peak past the window
        self._last: float | None = None
        self._n = 0
        self._tensor = False
        self._step: int | None = None  # the training step of the last rate read

    def optimizer_pre(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """Read the rate the coming update uses (the primary optimizer's checked steps)."""
        if not checked or not ctx.is_primary(optimizer) or ctx.step == self._step:
            return  # one rate per training step: a second primary optimizer (a GAN's) has its own schedule
        lrs = group_lrs(optimizer)
        if lrs is None:
            self._tensor = self._tensor or bool(getattr(optimizer, "param_groups", None))
            return
        lr, step = max(lrs), ctx.step
        self._step = step
        self._n += 1
        self._last = lr
        if len(self._lrs) < self.WINDOW:
            self._lrs.append((step, lr))
        elif self._peak is None or lr > self._peak[1]:
            self._peak = (step, lr)

    def summary(self) -> dict[Any, Any]:
        """``lr_first``, ``lr_warmup_steps``, ``lr_last`` and ``lr_checked`` (nothing before the
        first rate read)."""
        r = read_schedule(self._lrs)
        if r is None:
            return {}
        warm = r.warmup_steps
        if self._peak is not None and self._peak[1] * AT_PEAK > r.peak:  # the rate kept rising after the window
            warm = self._peak[0] - self._lrs[0][0]
        return {LR_FIRST: r.first, LR_WARMUP_STEPS: warm, LR_LAST: self._last, LR_CHECKED: self._n}

    def gaps(self) -> dict[Any, str]:
        """Why no rate was read: a tensor learning rate, or no optimizer step."""
        if self._lrs:
            return {}
        why = ("the learning rate is a tensor (reading it would sync)" if self._tensor
               else "no optimizer stepped the model's parameters on a checked step")
        return {sig: why for sig in self.signatures}

    def steps(self) -> dict[Any, int]:
        """The window's values are known from its last kept step on."""
        if not self._lrs:
            return {}
        return {LR_FIRST: self._lrs[-1][0], LR_WARMUP_STEPS: self._lrs[-1][0]}
