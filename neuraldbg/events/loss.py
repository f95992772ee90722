"""Optimizer instability from the loss curve: spikes, plateaus, divergence."""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Sequence

from neuraldbg.events.base import OPTIMIZER, Event, make_event
from neuraldbg.events.registry import Detector, register_detector
from neuraldbg.events.stepstats import StepStats

MAD_TO_SIGMA = 1.4826  # MAD of a normal sample times this estimates its standard deviation


# Windows here hold tens of values: plain-Python medians over lists are several times
# faster than numpy's per-call overhead, and this runs once per training step.

def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _sigma(values: Sequence[float]) -> float:
    """Robust standard deviation of ``values``: their MAD x 1.4826 (0 for fewer than one)."""
    if not values:
        return 0.0
    med = _median(values)
    return _median([abs(x - med) for x in values]) * MAD_TO_SIGMA


def _z(diff: float, sigma: float) -> float:
    """``diff / sigma``; with zero spread +/-inf for any difference and 0 for none."""
    if sigma == 0.0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / sigma


def robust_z(value: float, window: Sequence[float]) -> float:
    """Robust z-score of ``value`` against ``window``: (value - median) / (1.4826 * MAD).

    A window with zero spread gives +/-inf for any different value and 0 for an equal one.
    """
    w = [float(x) for x in window]
    return _z(value - _median(w), _sigma(w))


#: trailing values of the window whose median is the level a new loss is compared with
LEVEL_POINTS = 5


def trend_z(value: float, window: Sequence[float], level_points: int = LEVEL_POINTS) -> float:
    """Robust z-score of ``value`` against where ``window`` ended and how much it moves step to
    step: ``(value - median of the last level_points) / sigma`` with ``sigma`` the MAD of the
    first differences, ``x 1.4826 / sqrt 2``.

    A learning curve falls: against the whole window's median and spread (:func:`robust_z`) its
    own descent counts as noise, so a jump to 4x the current level scored z 4.4 on a transformer
    whose loss had halved over the window. Differences see only the step-to-step noise, and the
    trailing median is the level the curve has reached. Zero spread gives +/-inf (0 for equal).
    """
    w = [float(x) for x in window]
    tail = w[-max(1, min(level_points, len(w))):]
    # a difference of two independent values has sqrt(2) times their spread
    sigma = _sigma([b - a for a, b in zip(w, w[1:])]) / math.sqrt(2.0)
    return _z(value - _median(tail), sigma)


def is_spike(loss: float, window: Sequence[float], z: float, ratio: float) -> tuple[bool, float]:
    """A spike is an outlier of log loss (:func:`trend_z` above ``z``) that is also ``ratio`` x
    the window's median.

    Returns (is_spike, z). Works on positive losses; others are shifted into range by taking
    logs of ``loss - min(window) + 1`` so negative objectives (GAN, RL) work too.
    """
    w = [float(x) for x in window]
    if not w or not math.isfinite(loss):
        return False, 0.0
    lo = min(min(w), loss)
    shift = 0.0 if lo > 0 else 1.0 - lo
    lw = [math.log(x + shift) for x in w]
    lv = math.log(loss + shift)
    zz = trend_z(lv, lw)
    return (zz > z and (loss + shift) > ratio * math.exp(_median(lw))), zz


def _may_spike(loss: float, window: Sequence[float], ratio: float) -> bool:
    """False when :func:`is_spike` cannot hold: its ratio test compares with the exp of the
    median of logs, which is at least the window's minimum (in the same shifted units)."""
    lo = min(window)
    low = min(lo, loss)
    shift = 0.0 if low > 0 else 1.0 - low
    return loss + shift > ratio * (lo + shift) * (1.0 - 1e-9)


def relative_median_drop(window: Sequence[float], edge: int = 10) -> float:
    """How far the median fell across ``window``, relative to where it started.

    (median of the first ``edge`` values - median of the last ``edge``) / |first median|:
    positive when the values went down, 0.1 for a 10% drop.
    """
    w = [float(x) for x in window]
    edge = max(1, min(edge, len(w) // 2))
    a = _median(w[:edge])
    b = _median(w[-edge:])
    if a == 0:
        return 0.0 if b == 0 else math.copysign(math.inf, a - b)
    return (a - b) / abs(a)


@register_detector("loss")
class LossInstabilityDetector(Detector):
    """Spike, plateau and divergence events from the recorded loss (``layer`` is None).

    Divergence is a non-finite loss or sustained growth: the median of the last
    ``divergence_window`` losses above both ``divergence_factor`` x the first losses' median
    and ``divergence_best_factor`` x the best window median seen. Plateau: over
    ``plateau_window`` losses the relative improvement is below ``plateau_rel`` while the
    loss has made less than ``plateau_max_progress`` relative progress since the start.
    """

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._recent: deque[float] = deque(maxlen=max(config.spike_window, config.plateau_window))
        self._first: list[float] = []
        self._first_median: float | None = None  # fixed once the first window is full
        self._best = math.inf
        self._plateau_ok = context.family not in config.plateau_exempt_families

    def update(self, stats: StepStats) -> list[Event]:
        """Loss events at this step."""
        loss = stats.loss
        if loss is None:
            return []
        cfg = self.config
        step = stats.step
        if not math.isfinite(loss):
            return [make_event(OPTIMIZER, "divergence", None, step, 6.0,
                               {"loss": loss, "nonfinite": 1.0})]
        events: list[Event] = []
        recent = list(self._recent)
        if len(recent) >= cfg.spike_window:
            window = recent[-cfg.spike_window:]
            spike, z = False, 0.0
            if _may_spike(loss, window, cfg.spike_ratio):
                spike, z = is_spike(loss, window, cfg.spike_z, cfg.spike_ratio)
            start = abs(self._first_median) if self._first_median is not None else 0.0
            if spike and loss - (window_median := _median(window)) > cfg.spike_min_jump * start:
                events.append(make_event(OPTIMIZER, "spike", None, step, min(z, 1e3),
                                         {"loss": loss, "robust_z": z, "window_median": window_median}))
        self._recent.append(loss)
        recent.append(loss)
        if len(recent) > self._recent.maxlen:
            del recent[0]
        k = cfg.divergence_window
        if len(self._first) < k:
            self._first.append(loss)
            if len(self._first) == k:
                self._first_median = _median(self._first)
        if len(recent) >= k and self._first_median is not None:
            now = _median(recent[-k:])
            # the very first loss is measured before any update: a blow-up within the first
            # window must not contaminate the reference
            start = min(self._first_median, self._first[0])
            self._best = min(self._best, now, self._first[0])
            if (start > 0 and now > cfg.divergence_factor * start
                    and self._best > 0 and now > cfg.divergence_best_factor * self._best):
                events.append(make_event(OPTIMIZER, "divergence", None, step,
                                         math.log10(now / self._best),
                                         {"loss": loss, "window_median": now, "initial_median": start,
                                          "best_median": self._best}))
        if self._plateau_ok and len(recent) >= cfg.plateau_window and self._first_median is not None:
            window = recent[-cfg.plateau_window:]
            start = self._first_median
            level = _median(window[-10:])
            # the cheap test first: a run that made progress has no plateau to measure
            if (start > 0 and level > (1.0 - cfg.plateau_max_progress) * start
                    and (imp := relative_median_drop(window)) < cfg.plateau_rel):
                events.append(make_event(OPTIMIZER, "plateau", None, step, 1.0 - max(imp, 0.0) / cfg.plateau_rel,
                                         {"loss": loss, "relative_improvement": imp,
                                          "level_vs_start": level / start}))
        return events
