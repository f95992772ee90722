"""The learning-rate schedule as the optimizer applied it: its start, its peak, its decay.

The ``warmup`` evidence (``neuraldbg/causal/nodes/schedule.py``) needs to know whether the rate
started low and rose to its peak. The step size reads each step's rate but divides it out; this
measurement keeps the rates themselves: on each checked step of the primary optimizer, before
the update, the largest ``lr`` over its ``param_groups`` (host floats only: a tensor learning
rate is not read, reading it would sync, and the schedule is then unknown). Schedulers of every
kind (``torch.optim.lr_scheduler``, ``transformers``' warm-up schedules, Lightning's) write the
rate into ``param_groups``, so it needs no access to the scheduler.

Over the whole run (the ``lr_schedule`` evidence) it follows the rate with the step of each
change, in bounded memory: the step from which the rate has stayed at or below
``COLLAPSE_SHARE`` of its peak so far (a collapse: reset when the rate climbs back above), and
the steps at which the rate rose ``JUMP_FACTOR``-fold over the lowest of its last ``JUMP_WINDOW``
checked rates *after having decayed from an earlier peak* (a restart). A warm-up from the first
step, or a low constant phase before the peak, has not decayed from anything: it is no jump.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from neuraldbg.causal.nodes.schedule import (COLLAPSE_SHARE, JUMP_FACTOR, LR_CHECKED, LR_COLLAPSE_STEP,
                                             LR_FIRST, LR_JUMP_FACTOR, LR_JUMP_FROM, LR_JUMP_STEPS, LR_LAST,
                                             LR_WARMUP_STEPS)
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


#: checked steps a jump may take (a rate re-created at its peak arrives in one step, a short
#: restart warm-up in a few)
JUMP_WINDOW = 5
#: jumps kept (the first ones: a schedule restarted once shows at its first)
MAX_JUMPS = 8
#: a rate this far below the previous one has decayed (float schedules wobble by ulps)
DECAYED = 1.0 - 1e-6


class CourseTracker:
    """The rate's course over a run, fed ``(step, lr)`` one checked step at a time: the step of
    the collapse that lasts to the end, and the steps and size of jumps after a decay (see the
    module docstring). Pure Python, bounded memory."""

    def __init__(self) -> None:
        self.peak = 0.0
        self.decayed = False  # the rate has fallen below an earlier value
        self.collapse_step: int | None = None
        self.jumps: list[int] = []
        #: for each jump, the step after the last checked step before it: the rate changed
        #: somewhere in ``[jump_from, jump]`` (one step at every=1, an interval's width under a
        #: sparse cadence)
        self.jump_from: list[int] = []
        self.jump_factor = 0.0
        self._recent: deque[float] = deque(maxlen=JUMP_WINDOW)
        self._prev: float | None = None
        self._prev_step: int | None = None

    def add(self, step: int, lr: float) -> None:
        """One checked step's rate."""
        low = min(self._recent) if self._recent else None
        if self.decayed and low is not None and lr >= JUMP_FACTOR * low and lr > 0:
            factor = lr / low if low > 0 else float("inf")
            if len(self.jumps) < MAX_JUMPS:
                self.jumps.append(step)
                self.jump_from.append(self._prev_step + 1 if self._prev_step is not None else step)
            self.jump_factor = max(self.jump_factor, min(factor, 1e12))
            self._recent.clear()  # one jump is one change, however many steps of the window it covers
        if self._prev is not None and lr < DECAYED * self._prev:
            self.decayed = True
        self.peak = max(self.peak, lr)
        if self.peak > 0 and lr <= COLLAPSE_SHARE * self.peak * (1 + 1e-9):
            if self.collapse_step is None:
                self.collapse_step = step
        else:
            self.collapse_step = None  # the rate came back: only a collapse that lasts counts
        self._recent.append(lr)
        self._prev = lr
        self._prev_step = step


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

    signatures = (LR_FIRST, LR_WARMUP_STEPS, LR_LAST, LR_CHECKED, LR_COLLAPSE_STEP, LR_JUMP_STEPS, LR_JUMP_FROM,
                  LR_JUMP_FACTOR)
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
        self._course = CourseTracker()

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
        self._course.add(step, lr)
        if len(self._lrs) < self.WINDOW:
            self._lrs.append((step, lr))
        elif self._peak is None or lr > self._peak[1]:
            self._peak = (step, lr)

    def summary(self) -> dict[Any, Any]:
        """``lr_first``, ``lr_warmup_steps``, ``lr_last``, ``lr_checked``, ``lr_jump_steps`` (empty:
        no jump), and ``lr_collapse_step`` / ``lr_jump_factor`` when there is one (nothing before
        the first rate read)."""
        r = read_schedule(self._lrs)
        if r is None:
            return {}
        warm = r.warmup_steps
        if self._peak is not None and self._peak[1] * AT_PEAK > r.peak:  # the rate kept rising after the window
            warm = self._peak[0] - self._lrs[0][0]
        out = {LR_FIRST: r.first, LR_WARMUP_STEPS: warm, LR_LAST: self._last, LR_CHECKED: self._n,
               LR_JUMP_STEPS: list(self._course.jumps), LR_JUMP_FROM: list(self._course.jump_from)}
        if self._course.collapse_step is not None:
            out[LR_COLLAPSE_STEP] = self._course.collapse_step
        if self._course.jumps:
            out[LR_JUMP_FACTOR] = self._course.jump_factor
        return out

    def gaps(self) -> dict[Any, str]:
        """Why no rate was read: a tensor learning rate, or no optimizer step."""
        if self._lrs:
            return {}
        why = ("the learning rate is a tensor (reading it would sync)" if self._tensor
               else "no optimizer stepped the model's parameters on a checked step")
        return {sig: why for sig in self.signatures}

    def steps(self) -> dict[Any, int]:
        """The first rate from its step on, the warm-up from the window's last kept step; a collapse
        from its step, the jumps from the last one (a trace cut mid-run then reads what the monitor
        knew by then)."""
        if not self._lrs:
            return {}
        out = {LR_FIRST: self._lrs[0][0], LR_WARMUP_STEPS: self._lrs[-1][0]}
        if self._course.collapse_step is not None:
            out[LR_COLLAPSE_STEP] = self._course.collapse_step
        if self._course.jumps:
            out[LR_JUMP_STEPS] = out[LR_JUMP_FROM] = out[LR_JUMP_FACTOR] = max(self._course.jumps)
        return out
