"""Which steps the monitor checks: a fixed interval (``every=N``) or one it chooses itself to hold
an overhead budget (``every="auto"``, the default).

A *schedule* makes one decision per step, when the step starts (:meth:`start`): checked or not.
Everything downstream reads that decision rather than ``step % every``: the hooks' switches, the
optimizer hooks' quiet steps, the rotation of a deep model's output shares, the loop checks, the
event log's gap. The monitor's fast path for an unchecked step after an unchecked step (nine steps
in ten at every=10) reads one attribute, :attr:`next_start`, and calls nothing here.

``every="auto"`` (:class:`AutoSchedule`):

* **A dense start.** Every step of the first :data:`DENSE_START` steps is checked: the
  initialization, the loop checks' windows and the first losses live there.
* **Timed on the run itself.** Then the schedule measures, at step boundaries (``perf_counter``,
  host side, no device sync added), the wall time of checks and of unchecked steps. A check's
  cost does not end with its step: a loop that records the loss before ``optimizer.step()`` runs
  the checked update (the step-size probe, the update's non-finite check) in the next step's
  span. So a check is timed *with the step after it* (:func:`check_cost`: the two steps' time
  less two unchecked steps), and an unchecked step only when the step before it was unchecked
  too: the step two after a check is started on the full path to take that time. It keeps the
  last :data:`TIMING_WINDOW` samples of each and reads a robust mean of them (below); an
  unchecked step's time is the median of its samples, since nothing of the monitor's recurs
  there. The interval is ``N = ceil((1 + BAND) * extra / (overhead * t_unchecked))``, clamped to
  ``[1, MAX_INTERVAL]`` (:func:`interval_for` at the budget less the hysteresis band below): one
  checked step in N then adds at most ``overhead`` to the mean step time, as long as the
  interval stays within the band. A check right after another (in a dense window, or at
  ``N = 1``) is timed apart: it finds its buffers and caches warm and can cost less than an
  isolated one, so mixing the two would size a sparse interval by checks it will not pay for.
  Every step is checked when a hot check fits the budget; a sparser interval is sized by its
  isolated checks (:func:`choose_interval`). The monitor's host transfer (one per
  ``sync_every`` checks) is timed apart and spread over the checks, so that a span far longer
  than its kind's median (:data:`CLIP`) can be told as a pause between steps (a validation pass,
  another model's steps) and counted as the median. The checked steps are the multiples of N,
  as at ``every=N`` (a snapshot ring's spacing lines up with them). Until the first estimate it
  checks every :data:`PROBE_INTERVAL`-th step (a check, the step after it, and unchecked steps
  after that to time), then estimates again every :data:`REESTIMATE_CHECKS` checked steps,
  moving only when the new interval leaves a band of :data:`BAND` around the current one
  (:func:`with_hysteresis`), so noise does not make it oscillate.
* **Dense again after an anomaly.** A non-finite loss, a loss spike (above :data:`SPIKE_FACTOR`
  times the median of the last :data:`SPIKE_WINDOW` finite losses, and :data:`SPIKE_MIN_JUMP` of
  the first losses' level above it, as the loss detector's spikes), or the onset of an acute
  detector event (:data:`ALARM_EVENTS`) checks every step for the next
  :data:`DENSE_AFTER_ANOMALY` steps. Losses are judged on the host only: a Python float when it
  is recorded, a tensor when the monitor's own transfer brings it there (never a sync of its own).

On CUDA the timing is that of the host: kernels a check queues run asynchronously and show up
wherever the loop next waits for the device (reading the loss, usually every step), which is
what the user sees. Step times are per step *number*: a loop that numbers its steps sparsely
(``dbg.step += 10``) gets its interval in those numbers.

The choices made are recorded (:meth:`AutoSchedule.record`, a
:class:`~neuraldbg.trace.CadenceRecord`): the interval from each step on, the budget, the
anomalies that made the cadence dense again. The trace and the session carry it, and the report
says it in one line (:func:`describe`).
"""
from __future__ import annotations

import logging
import math
from collections import deque
from statistics import median
from time import perf_counter
from typing import Any, Callable, Iterable

from neuraldbg.trace import CADENCE_AUTO, CADENCE_PROBE, CadenceRecord

log = logging.getLogger("neuraldbg")

#: ``every="auto"``: the monitor chooses the interval
AUTO = CADENCE_AUTO
#: the overhead budget of ``every="auto"`` when not given: 3 % of the mean step time
DEFAULT_OVERHEAD = 0.03
#: steps checked one by one at the start of a run (at least: the window starts at the first
#: step and ends ``DENSE_START`` steps after the first step the loop starts)
DENSE_START = 32
#: steps checked one by one after an anomaly (a non-finite loss, a loss spike, an acute event)
DENSE_AFTER_ANOMALY = 16
#: the largest interval: one check in a thousand steps still sees a slow drift
MAX_INTERVAL = 1000
#: the interval between the start window and the first estimate (unchecked steps to time)
PROBE_INTERVAL = CADENCE_PROBE
#: timing samples kept per kind (checked, unchecked)
TIMING_WINDOW = 32
#: samples of each kind before the first estimate
MIN_SAMPLES = 8
#: checked steps between two estimates
REESTIMATE_CHECKS = 8
#: a sample above ``CLIP`` times its window's median counts as the median: a check with its tail
#: that long (three steps' time more than the usual pair) is a gap between steps, not the check
CLIP = 4.0
#: hysteresis: a new estimate moves the interval only when it is more than ``1 + BAND`` times
#: larger or smaller than the current one
BAND = 0.25
#: a loss above ``SPIKE_FACTOR`` times the recent median is a spike
SPIKE_FACTOR = 3.0
#: finite losses the spike threshold is the median of
SPIKE_WINDOW = 20
#: finite losses before a spike can be told; the median of the first ones is the run's start level
SPIKE_MIN_LOSSES = 5
#: a spike also rises this share of the start level above the recent median: the loss detector's
#: ``spike_min_jump``, so that the checks go dense where a spike event can follow. A loss near
#: its floor triples on a batch it gets wrong (a 12-layer BERT fitting its batches, at 0.01,
#: did every 16 steps: dense windows end to end, the cost of every step under "auto")
SPIKE_MIN_JUMP = 0.5
#: ``(type, kind)`` of the detector events whose onset makes the cadence dense again: acute ones
#: (a persistent regime, dead units or a plateau, would keep it dense for nothing)
ALARM_EVENTS = frozenset({("optimizer_instability", "spike"), ("optimizer_instability", "divergence"),
                          ("data_anomaly", "nan"), ("data_anomaly", "inf"), ("data_anomaly", "shift"),
                          ("gradient_health_transition", "exploding")})
#: interval changes and anomalies kept in the record (the first ones and the latest changes)
MAX_CHANGES = 256
MAX_ALARMS = 32
#: why the cadence went dense again, as the record says it
NONFINITE_LOSS = "non-finite loss"
LOSS_SPIKE = "loss spike"

_NEG_INF = -math.inf
#: float rounding must not add a step: a ratio within this of an integer counts as that integer
_EPS = 1e-9


# ---- pure functions ---------------------------------------------------------------------

def interval_for(t_checked: float, t_unchecked: float, overhead: float, most: int = MAX_INTERVAL) -> int:
    """The interval ``N`` that keeps the checks' extra time within ``overhead`` of the mean step:
    ``(t_checked - t_unchecked) / (N * t_unchecked) <= overhead``, so
    ``N = ceil(extra / (overhead * t_unchecked))``, clamped to ``[1, most]``. A check no slower
    than an unchecked step gives 1; an unchecked step of no measurable time gives ``most``."""
    extra = t_checked - t_unchecked
    if not extra > 0:  # also NaN: nothing known against checking every step
        return 1
    if not t_unchecked > 0:
        return most
    n = math.ceil(extra / (overhead * t_unchecked) - _EPS)
    return max(1, min(most, n))


def check_cost(t_span: float, span: float, t_unchecked: float) -> float:
    """The extra time of one check from the mean per-step time ``t_span`` of the spans that hold
    a check and its tail (``span`` steps each on average: the checked step and the step after
    it, whose span runs the checked update) and the unchecked step's ``t_unchecked``:
    ``span * (t_span - t_unchecked)``. Pure."""
    return span * (t_span - t_unchecked)


def choose_interval(sparse: float | None, hot: float | None, t_unchecked: float, overhead: float,
                    most: int = MAX_INTERVAL) -> int:
    """The interval from the extra time of an isolated check (``sparse``, with its tail) and of a
    check right after another (``hot``), either unknown (None), over an unchecked step of
    ``t_unchecked``. A check can cost more alone than in a run of checks (its buffers, caches
    and allocator cold), so every step is checked
    when a hot check fits ``overhead`` (:func:`interval_for` gives 1), and a sparser interval is
    sized by what its isolated checks cost. With only hot checks timed (a run checked every step
    since), their cost is the one known. Pure."""
    if hot is not None and interval_for(t_unchecked + hot, t_unchecked, overhead, most) == 1:
        return 1
    extra = sparse if sparse is not None else hot
    if extra is None:
        raise ValueError("choose_interval needs the cost of an isolated check or of a hot one")
    return interval_for(t_unchecked + extra, t_unchecked, overhead, most)


def with_hysteresis(current: int, proposed: int, band: float = BAND) -> int:
    """``proposed`` when it leaves the band around ``current`` (more than ``1 + band`` times
    larger or smaller), else ``current``: an estimate that wobbles with the timing noise keeps
    the interval where it is."""
    if proposed > current * (1 + band) or proposed * (1 + band) < current:
        return proposed
    return current


def robust_mean(samples: Iterable[float], clip: float = CLIP) -> float:
    """The mean of ``samples`` with each one above ``clip`` times their median counted as the
    median (NaN for none): a span that long holds something else than the check (a validation
    pass or another model's steps between two steps); the monitor's own periodic cost, the host
    transfer, is timed apart and never in them. Pure."""
    xs = list(samples)
    if not xs:
        return math.nan
    med = median(xs)
    return sum(x if x <= clip * med else med for x in xs) / len(xs)


def spike_threshold(recent: Iterable[float], start: float | None = None, factor: float = SPIKE_FACTOR,
                    least: int = SPIKE_MIN_LOSSES, jump: float = SPIKE_MIN_JUMP) -> float:
    """The loss above which a loss is a spike: ``factor`` times the median of the ``recent``
    finite losses, and at least ``jump`` times ``|start|`` (the level of the run's first losses)
    above that median; infinite (no spike can be told) with fewer than ``least`` of them or a
    median that is not positive (a loss that can be negative has no scale to be a multiple of).
    Pure."""
    xs = list(recent)
    if len(xs) < least:
        return math.inf
    med = median(xs)
    if not med > 0:
        return math.inf
    return max(factor * med, med + jump * abs(start)) if start is not None else factor * med


def _no_time() -> float:
    return 0.0


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.3g}"


# ---- schedules ----------------------------------------------------------------------------

class _Record:
    """The interval changes and the anomalies of a schedule, bounded (:data:`MAX_CHANGES`,
    :data:`MAX_ALARMS`): the first ones and the latest changes are kept, the others counted."""

    def __init__(self, first: int, interval: int) -> None:
        self.changes: list[tuple[int, int]] = [(first, interval)]
        self.alarms: list[tuple[int, int, str]] = []  # (anomaly's step, first dense step, why)
        self.changes_omitted = self.alarms_omitted = 0

    def change(self, step: int, interval: int) -> None:
        if self.changes[-1][0] == step:  # two changes at one step: the later stands
            self.changes[-1] = (step, interval)
            if len(self.changes) > 1 and self.changes[-2][1] == interval:
                self.changes.pop()
            return
        self.changes.append((step, interval))
        if len(self.changes) > MAX_CHANGES:
            # the start window and the first interval after it say how the run began: drop the
            # oldest of the others
            del self.changes[2]
            self.changes_omitted += 1

    def alarm(self, step: int, dense_from: int, why: str) -> None:
        if len(self.alarms) < MAX_ALARMS:
            self.alarms.append((step, dense_from, why))
        else:
            self.alarms_omitted += 1


class FixedSchedule:
    """``every=N``: steps that are multiples of ``N`` are checked, as they always were."""

    #: no anomaly is looked for, so no float loss is ever above this
    spike_above = math.inf

    def __init__(self, every: int) -> None:
        self.every = every
        #: the interval in force (always ``every``)
        self.interval = every
        #: the interval the initialization is checked at (the ``every`` signature)
        self.entry_interval = every
        self.budget = None
        #: the first step after the last one started that will be checked (step 0, the monitor's
        #: first buffer, is checked)
        self.next_check = every
        #: the next step that must be started here (the monitor's fast path skips the others)
        self.next_start = every
        self.checks = 1  # checked steps so far (step 0 is)
        self._record = _Record(0, every)
        self._started = False

    def start(self, step: int) -> bool:
        """Whether ``step``, starting now, is checked (once per step, when it starts)."""
        if not self._started:
            self._started = True
            if step != 1:  # the loop numbers its own steps: its first is where the record starts
                self._record.changes[0] = (step, self.every)
        self.next_check = self.next_start = (step // self.every + 1) * self.every
        checked = step % self.every == 0
        self.checks += checked
        return checked

    def interval_now(self, step: int) -> int:
        """The interval in force at the current ``step``."""
        return self.every

    def near_check(self, step: int) -> bool:
        """Whether ``step`` is checked or the one after a checked step (whose optimizer step,
        without ``dbg.step``, belongs to the checked one)."""
        return self.every == 1 or step % self.every < 2

    def check_index(self, step: int) -> int:
        """The rank of the checked ``step`` among the checks (rotating output shares)."""
        return step // self.every

    def checked_since(self, step: int, now: int) -> bool:
        """Whether every step from ``step`` to ``now`` was checked."""
        return self.every == 1

    def alarm(self, step: int, now: int, why: str) -> bool:
        """An anomaly: a fixed interval does not move (False)."""
        return False

    def watch_loss(self, step: int, value: float, now: int) -> None:
        """A loss on the host: a fixed interval does not look at it."""

    def record(self) -> CadenceRecord:
        """The cadence so far."""
        r = self._record
        return CadenceRecord(every=self.every, budget=None, changes=tuple(r.changes))


class AutoSchedule:
    """``every="auto"``: the interval chosen on the run to hold ``overhead`` (module docstring).

    ``clock`` (seconds, default ``time.perf_counter``) is what step boundaries are timed with;
    tests pass their own.
    """

    every = AUTO

    def __init__(self, overhead: float = DEFAULT_OVERHEAD, clock: Callable[[], float] | None = None,
                 busy: Callable[[], float] | None = None) -> None:
        self.budget = overhead
        self.clock = clock if clock is not None else perf_counter
        #: cumulative seconds of the monitor's host transfers (timed apart: :meth:`_estimate`)
        self.busy = busy if busy is not None else _no_time
        #: the sparse interval (the probe's until the first estimate); dense windows check every step
        self.interval = PROBE_INTERVAL
        self.entry_interval = 1
        #: steps before this one are checked one by one (the start window, or after an anomaly)
        self.dense_until = DENSE_START
        self.next_check = 1
        #: the next step that must be started here: the next check, or the step two after a check
        #: (timed, :meth:`start`); the monitor's fast path skips the others
        self.next_start = 1
        self.last_checked = 0
        self.run_start = 0       # the first step of the run of consecutive checks ending at last_checked
        self.checks = 1          # checked steps so far (step 0 is)
        self.current = 0         # the last step started (on the full path: the fast path starts none here)
        #: the loss above which a float loss is an anomaly (``record_loss`` compares against it)
        self.spike_above = math.inf
        self._started = False
        self._t_start = math.nan  # the clock when ``current`` started
        self._b_start = 0.0       # the transfers' time when ``current`` started
        self._busy_from: tuple[float, int] | None = None  # (transfers' time, checks) when timing began
        self._timed_from = DENSE_START  # samples of steps before this one are not representative
        #: per-step time of the spans that hold an isolated check and the step after it, and their
        #: length; and of back-to-back checks (a dense window, or every step), one check each
        self._checked_times: deque[float] = deque(maxlen=TIMING_WINDOW)
        self._check_spans: deque[int] = deque(maxlen=TIMING_WINDOW)
        self._hot_times: deque[float] = deque(maxlen=TIMING_WINDOW)
        self._unchecked_times: deque[float] = deque(maxlen=TIMING_WINDOW)
        #: (checked step, its start, whether it was an isolated check) awaiting its tail
        self._pair_from: tuple[int, float, bool] | None = None
        self._estimated = False
        self._since_estimate = 0
        self._recent: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self._first: list[float] = []      # the first finite losses, whose median is the start level
        self._start: float | None = None
        self._bad_through = -2      # the last step whose loss was an anomaly
        self._alarmed_through = -1  # the last anomaly's step that was acted on
        self._record = _Record(0, 1)

    # ---- the decision, once per step ------------------------------------------------------
    def start(self, step: int) -> bool:
        """Whether ``step``, starting now, is checked; times the span that ended and re-estimates
        the interval every few checks (once per checked step and per each of the two steps after
        one: the fast path of the other unchecked steps never comes here)."""
        now, busy = self.clock(), self.busy()
        checked = step < self.dense_until or step >= self.next_check
        if not self._started:
            self._started = True
            self.dense_until = max(self.dense_until, step + DENSE_START)
            self._timed_from = self.dense_until
            checked = True
            if step != self.current + 1:  # the loop numbers its own steps: its first starts the window
                self._record.changes[0] = (step, 1)
        elif step > self.current >= self._timed_from - 1:
            # from the last check of the start window on: its tail is the first timed step
            self._time(step, now, busy, checked)
        self.current, self._t_start, self._b_start = step, now, busy
        if checked:
            if self.last_checked != step - 1:
                self.run_start = step
            self.last_checked = step
            self.checks += 1
            if step >= self._timed_from:
                self._since_estimate += 1
                if self._since_estimate >= (REESTIMATE_CHECKS if self._estimated else 1):
                    self._estimate(step)
            dense = step + 1 < self.dense_until
            self.next_check = step + 1 if dense else (step // self.interval + 1) * self.interval
            interval = 1 if dense else self.interval
            if interval != self._record.changes[-1][1]:
                self._record.change(step + 1, interval)
        # the step after this one is started here anyway when this one is checked (its buffer is
        # closed in full); the step two after a check is, to time the check's tail
        self.next_start = min(self.next_check, step + 1) if self._pair_from is not None else self.next_check
        return checked

    def _time(self, step: int, now: float, busy: float, checked: bool) -> None:
        """File the time of the span that ended at ``step`` (the last step started, and the
        unchecked ones after it on the fast path), less the host transfers in it (counted apart):
        a check with the step after it (one sample of the check's cost), or unchecked steps after
        an unchecked one."""
        if self._busy_from is None:
            self._busy_from = (self._b_start, self.checks)
        prev, span = self.current, (now - self._t_start) - (busy - self._b_start)
        if prev == self.last_checked:
            if checked and step == prev + 1:  # back-to-back checks: each span holds one check's work
                self._hot_times.append(span)
                self._pair_from = None
            else:  # its update runs in the next step's span: timed together, at the next start
                # (the last check of a run of checks is warm, and not an isolated one's cost)
                self._pair_from = (prev, self._t_start - self._b_start, self.run_start == prev)
        elif self._pair_from is not None:
            first, t0, isolated = self._pair_from
            if isolated:
                self._checked_times.append(((now - busy) - t0) / (step - first))
                self._check_spans.append(step - first)
            self._pair_from = None
        else:
            self._unchecked_times.append(span / (step - prev))

    def _estimate(self, step: int) -> None:
        """A new interval from the timings, when there are enough unchecked samples and enough
        of one kind of check (:func:`choose_interval`)."""
        if len(self._unchecked_times) < MIN_SAMPLES:
            return
        # the unchecked step's time is their median: nothing of the monitor's recurs on them,
        # and whatever else runs between two steps (an evaluation, a checkpoint, another
        # model's steps) would make a check look free; a check's own periodic cost (the host
        # transfer) does recur, so its samples are averaged
        t_u = median(self._unchecked_times)
        # the host transfers (one per sync_every checks) are the checks' cost too, timed apart so
        # that a gap between two steps can be told from them: their time per check since timing began
        b0, c0 = self._busy_from if self._busy_from is not None else (self.busy(), self.checks)
        transfer = max(0.0, self.busy() - b0) / max(1, self.checks - c0)
        sparse = hot = None
        if len(self._checked_times) >= MIN_SAMPLES:
            span = sum(self._check_spans) / len(self._check_spans)
            sparse = check_cost(robust_mean(self._checked_times), span, t_u) + transfer
        if len(self._hot_times) >= MIN_SAMPLES:
            hot = check_cost(robust_mean(self._hot_times), 1, t_u) + transfer
        if sparse is None and hot is None:
            return
        # aimed at the budget's lower side by the band, so that an interval kept within the band
        # of the estimate still holds the budget (overhead between 1 / (1 + BAND)^2 and 1 of it)
        proposed = choose_interval(sparse, hot, t_u, self.budget / (1 + BAND))
        new = with_hysteresis(self.interval, proposed) if self._estimated else proposed
        self._estimated = True
        self._since_estimate = 0
        if new != self.interval:
            log.debug("neuraldbg: a check adds %s ms alone, %s ms after another, to an unchecked %.3g ms: checking "
                      "every %d steps from step %d (budget %g)", _ms(sparse), _ms(hot), t_u * 1e3, new, step + 1,
                      self.budget)
            self.interval = new

    def interval_now(self, step: int) -> int:
        """The interval in force at the current ``step``: 1 in a dense window."""
        return 1 if step < self.dense_until else self.interval

    def near_check(self, step: int) -> bool:
        """Whether ``step`` is checked or the one after a checked step (whose optimizer step,
        without ``dbg.step``, belongs to the checked one)."""
        return step == self.last_checked or step - 1 == self.last_checked

    def check_index(self, step: int) -> int:
        """The rank of the checked ``step`` among the checks (rotating output shares)."""
        return self.checks

    def checked_since(self, step: int, now: int) -> bool:
        """Whether every step from ``step`` to ``now`` was checked (one run of checks covers them)."""
        return self.run_start <= step and now <= self.last_checked

    # ---- anomalies ----------------------------------------------------------------------------
    def alarm(self, step: int, now: int, why: str) -> bool:
        """An anomaly at ``step`` noticed while ``now`` is the current step: every step from
        ``now + 1`` on is checked for :data:`DENSE_AFTER_ANOMALY` steps. An anomaly at a step
        already acted on is ignored. True when it opened or extended a dense window."""
        if step <= self._alarmed_through:
            return False
        self._alarmed_through = step
        until = now + 1 + DENSE_AFTER_ANOMALY
        if until <= self.dense_until:
            return False
        fresh = self.dense_until <= now + 1  # the last dense window had ended
        self.dense_until = until
        if now + 1 < self.next_check:
            self.next_check = now + 1
        self.next_start = min(self.next_start, self.next_check)
        if fresh and self._record.changes[-1][1] != 1:
            self._record.change(now + 1, 1)
            self._record.alarm(step, now + 1, why)
            log.debug("neuraldbg: %s at step %d: checking every step from step %d to %d", why, step, now + 1,
                      until - 1)
        return True

    def watch_loss(self, step: int, value: float, now: int) -> None:
        """A loss on the host (a float as recorded, or a tensor's once transferred), in step
        order: the onset of a run of non-finite or spiking losses is an anomaly; a normal loss
        joins the recent window the spike threshold is the median of."""
        if not (_NEG_INF < value < self.spike_above):
            if step > self._bad_through + 1:
                self.alarm(step, now, LOSS_SPIKE if math.isfinite(value) else NONFINITE_LOSS)
            if step > self._bad_through:
                self._bad_through = step
            return
        if step <= self._bad_through:
            return  # a float already judged when it was recorded: its window entry comes once, here
        self._recent.append(value)
        if len(self._first) < SPIKE_MIN_LOSSES:
            self._first.append(value)
            if len(self._first) == SPIKE_MIN_LOSSES:
                self._start = median(self._first)
        self.spike_above = spike_threshold(self._recent, self._start)

    def record(self) -> CadenceRecord:
        """The cadence so far."""
        r = self._record
        return CadenceRecord(every=AUTO, budget=self.budget, changes=tuple(r.changes), alarms=tuple(r.alarms),
                             changes_omitted=r.changes_omitted, alarms_omitted=r.alarms_omitted)


def schedule_for(every: int | str, overhead: float = DEFAULT_OVERHEAD,
                 busy: Callable[[], float] | None = None) -> FixedSchedule | AutoSchedule:
    """The schedule of validated settings (``every`` an int >= 1 or ``"auto"``); ``busy``: the
    cumulative seconds of the monitor's host transfers, which ``"auto"`` counts apart."""
    return AutoSchedule(overhead, busy=busy) if every == AUTO else FixedSchedule(every)


def check_every(every: Any) -> int | str:
    """``every`` as a valid cadence: an int >= 1 or ``"auto"``; ``ValueError`` naming what is valid."""
    if isinstance(every, str) and every == AUTO:
        return AUTO
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an int >= 1 (check every Nth step) or 'auto' (an interval that holds "
                         f"the overhead budget), got {every!r}")
    return every


def check_overhead(overhead: Any) -> float:
    """``overhead`` as a budget in (0, 1): the share of the mean step time ``every="auto"`` may add;
    ``ValueError`` naming what is valid."""
    if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not 0 < overhead < 1:
        raise ValueError(f"overhead must be a number in (0, 1), the share of the step time the checks may add "
                         f"under every='auto' (e.g. 0.03 for 3 %), got {overhead!r}")
    return float(overhead)
