"""A classifier at its floor: where a run's loss starts, and what a confident model's batches do.

A model whose loss sits near zero is judged by two readings that do not hold for one still
learning: a single batch it gets partly wrong lifts its loss many-fold for one step, and the
gradients of such a batch, or of any batch against baselines formed at the floor, grow by orders
of magnitude. Neither is instability, and the nodes that read spikes (``loss_pattern``), exploding
gradients (``exploding``) and their order (``order``) consult this module. No node is declared
here; pure functions on loss histories, and memoized readings of a :class:`TraceView`.

Cut points (reasoning in ``docs/causal_model.md``):

* ``LOSS_HEAD`` -- the head of a run: its first tenth of finite losses (at least 3), whose
  median is where it started.
* ``FLOOR_START`` -- a run entered on trained weights whose loss starts below this share of
  chance level (the monitor's ``TRAINED_START``) is at its floor: a flat or slow curve there is a
  model with little left to gain, not a stall (``loss_pattern_reading``); without a chance
  level, any flat or slow curve of such a run.
* ``RECOVER_POINTS``/``RECOVER_FACTOR`` -- a classifier's loss spike is a batch's confident
  mistakes, not instability (:func:`confident_mistakes`), when it peaked below chance level
  ``ln K`` and the median of the next ``RECOVER_POINTS`` recorded losses is back within
  ``RECOVER_FACTOR`` x the level before it. A model thrown off by an unstable step loses what it
  learned: its loss goes to chance or above and stays up for many steps. A confident model's
  loss near zero jumps 50x when one example of a batch is confidently wrong, and is back at its
  floor on the next batch (a healthy 12-block post-norm encoder: 0.012 -> 0.72 -> 0.009, chance
  1.39). Every spike of an injected fault in both suites peaked above 0.9 ln K or stayed up.
  The spikes of a merged episode are read from the loss history (:func:`excursions`: each
  recorded loss above ``RECOVER_FACTOR`` x the median of the ``LEVEL_POINTS`` before it, the
  spike detector's window), and every one must qualify: a healthy encoder resumed from its
  checkpoint spikes from 5e-4 to 0.03, 0.28 and 0.05 on three single batches of 120 steps, one
  collapsed spike event whose later peaks its measurement does not carry.
* The same factor bounds a batch at the floor (:func:`floor_batch`) of a run entered there: its
  loss and the median of the next ``RECOVER_POINTS`` within ``RECOVER_FACTOR`` x the floor. Such a
  run forms its gradient baselines from residual errors (the resumed encoder's positional
  embedding: 5.7e-7), which one batch's few imperfect examples grow 126x while its mean loss
  moves from 4.8e-4 to 5.8e-4 (:func:`batch_gradients`).
"""
from __future__ import annotations

import math
from typing import Sequence

from neuraldbg.causal.nodes.run import chance_loss, started_trained
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import OPTIMIZER, Event

LOSS_HEAD = 0.1
FLOOR_START = 0.5
RECOVER_POINTS = 5
RECOVER_FACTOR = 2.0
LEVEL_POINTS = 20


def median(xs: Sequence[float]) -> float:
    """The upper median of ``xs`` (no interpolation: a value that occurred)."""
    s = sorted(xs)
    return s[len(s) // 2]


def head_level(values: Sequence[float]) -> float:
    """The median of the first ``LOSS_HEAD`` of ``values`` (at least 3; finite values). Pure."""
    return median(values[:max(3, int(len(values) * LOSS_HEAD))])


def starts_at_floor(values: Sequence[float], chance: float | None) -> bool:
    """Whether a run entered on trained weights starts at its floor: the median of its first
    ``LOSS_HEAD`` of finite losses (at least 3) below ``FLOOR_START`` x chance level ``chance``,
    or any start without a chance level (nothing says it is far from its floor then; ``progress``
    is unobserved for the same reason). Pure; the caller checks that the run started trained."""
    if len(values) < 3:
        return False
    if chance is None:
        return True
    return head_level(values) < FLOOR_START * chance


def trained_floor(view: TraceView) -> float | None:
    """The floor of a run entered on trained weights at its floor (:func:`starts_at_floor`, with a
    chance level known): the median of its first ``LOSS_HEAD`` of finite losses; else None."""
    chance = chance_loss(view.signatures)
    if chance is None or not started_trained(view.signatures):
        return None
    vals = [v for _, v in view.trace.loss.history if math.isfinite(v)]
    return head_level(vals) if starts_at_floor(vals, chance) else None


def _back(history: Sequence[tuple[int, float]], step: int, level: float) -> bool:
    """Whether the median of the ``RECOVER_POINTS`` losses recorded after ``step`` is finite and
    back within ``RECOVER_FACTOR`` x ``level``."""
    after = [v for s, v in history if s > step][:RECOVER_POINTS]
    return (len(after) == RECOVER_POINTS and all(math.isfinite(v) for v in after)
            and median(after) <= RECOVER_FACTOR * level)


def _mistake(history: Sequence[tuple[int, float]], step: int, peak: float, level: float, chance: float) -> bool:
    """Whether a loss of ``peak`` at ``step`` over ``level`` is a batch's confident mistakes: finite,
    below chance level ``chance``, and the next recorded losses back at the level."""
    return math.isfinite(peak) and peak < chance and _back(history, step, level)


def excursions(history: Sequence[tuple[int, float]], start: int, end: int) -> list[tuple[int, float, float]]:
    """``(step, loss, level)`` of each recorded loss from ``start`` to ``end`` above
    ``RECOVER_FACTOR`` x its level, the median of the ``LEVEL_POINTS`` finite losses recorded
    before it (the spike detector's window); a non-finite loss is always one. Pure."""
    out = []
    for i, (step, v) in enumerate(history):
        if not start <= step <= end:
            continue
        before = [x for _, x in history[max(0, i - LEVEL_POINTS):i] if math.isfinite(x)]
        if not before:
            continue
        level = median(before)
        if not math.isfinite(v) or v > RECOVER_FACTOR * level:
            out.append((step, v, level))
    return out


def mistaken_batch(history: Sequence[tuple[int, float]], step: int, chance: float | None) -> bool:
    """Whether the loss recorded at ``step`` is one batch's confident mistakes: an excursion
    (:func:`excursions`) that stayed finite and below the chance level ``chance``, the median of
    the next ``RECOVER_POINTS`` recorded losses back within ``RECOVER_FACTOR`` x its level. False
    without a chance level, or when ``step`` is no excursion (or was not recorded). Pure."""
    if chance is None:
        return False
    points = excursions(history, step, step)
    return bool(points) and all(_mistake(history, s, v, level, chance) for s, v, level in points)


def floor_batch(history: Sequence[tuple[int, float]], step: int, floor: float) -> bool:
    """Whether the loss recorded at ``step`` sits at the run's floor ``floor``: finite, within
    ``RECOVER_FACTOR`` x ``floor``, and the median of the next ``RECOVER_POINTS`` recorded losses
    too. False when ``step`` was not recorded. Pure."""
    at = [v for s, v in history if s == step]
    return (bool(at) and math.isfinite(at[0]) and at[0] <= RECOVER_FACTOR * floor
            and _back(history, step, floor))


def confident_mistakes(spikes: Sequence[Event], history: Sequence[tuple[int, float]], chance: float | None) -> bool:
    """Whether every loss spike in ``spikes`` is a batch's confident mistakes rather than
    instability: each peaked below the chance level ``chance`` and the median of the next
    ``RECOVER_POINTS`` recorded losses is back within ``RECOVER_FACTOR`` x the level before it. A
    single spike is read as the event measured it (its peak, its window median); the later peaks
    of a merged episode (``count`` > 1) are read from ``history`` (:func:`excursions` from its
    first step to its last), where every one of them must be found: a history downsampled past
    them cannot tell. False without a chance level or with no spike. Pure."""
    if chance is None or not spikes:
        return False
    for e in spikes:
        m = e.measured
        peak, level = m.get("loss"), m.get("window_median")
        if peak is None or level is None:
            return False
        points = [(e.step, peak, level)] if e.count == 1 else excursions(history, e.step, e.end_step)
        if len(points) < e.count or not all(_mistake(history, s, v, lvl, chance) for s, v, lvl in points):
            return False
    return True


def spikes_were_mistakes(view: TraceView) -> bool:
    """Whether the run had loss spikes and every one was a batch's confident mistakes
    (:func:`confident_mistakes`), read once per view."""
    def read(v: TraceView) -> bool:
        spikes = [e for e in v.events if e.type == OPTIMIZER and e.kind == "spike"]
        return confident_mistakes(spikes, v.trace.loss.history, chance_loss(v.signatures))
    return view.memo("spikes_were_mistakes", read)


def batch_gradients(events: Sequence[Event], history: Sequence[tuple[int, float]], chance: float | None,
                    floor: float | None = None) -> bool:
    """Whether every event of ``events`` (exploding gradients) falls on a step whose loss was one
    batch's confident mistakes (:func:`mistaken_batch`) or, in a run entered on trained weights at
    its floor ``floor`` (None: not such a run), a step whose loss stayed at that floor
    (:func:`floor_batch`): each occurrence known (a merged event's first and last step, no more
    than two), and each such a step.

    A model at its floor has tiny gradients; a batch it gets partly wrong (the loss 2x or 50x its
    floor, still far below chance) has gradients many times their recent level, and the next
    batches show the weights unharmed. A run entered at its floor forms its gradient baselines
    there, from residual errors: one batch's few imperfect examples grow them 100x while the
    batch's mean loss barely moves. Pure."""
    if not events or chance is None:
        return False
    seen: dict[int, bool] = {}
    for e in events:
        known = {e.step, e.end_step}
        if e.count > len(known):
            return False
        for step in known:
            if step not in seen:
                seen[step] = mistaken_batch(history, step, chance) or (
                    floor is not None and floor_batch(history, step, floor))
            if not seen[step]:
                return False
    return True
