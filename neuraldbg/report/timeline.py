"""The diagnosis as it stood at each checked step, read from a stored trace.

A :class:`~neuraldbg.trace.Trace` holds a whole run; :func:`trace_until` cuts it back to what
the monitor had seen by a given step (events started by then, clipped to it; the loss curve up
to it), and :func:`posterior_timeline` asks the causal engine for the posterior of each cut.
A cut keeps only the signatures the live monitor had measured by then (each records the
step it was measured by; ``neuraldbg/trace.py``): the weight scale from the first step, the
step size once its window closed, a run-long summary such as a reference loss's tail only
at the end. End-of-run evidence never leaks into an early step.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

from neuraldbg.trace import LossSummary, Trace

#: most steps a timeline evaluates by default (the loss history itself keeps at most 512)
MAX_POINTS = 512


@dataclass(frozen=True)
class TimelinePoint:
    """The posterior as of one checked step: ``P(healthy)`` and every abnormal root state."""

    step: int
    p_healthy: float
    abnormal: tuple[tuple[str, str, float], ...]  # (variable, state, p), most probable first

    def probability(self, cause: str, state: str) -> float:
        """``P(cause = state)`` at this step (0 when the state is unknown)."""
        for v, s, p in self.abnormal:
            if v == cause and s == state:
                return p
        return 0.0


def _loss_until(loss: LossSummary, step: int) -> LossSummary:
    hist = tuple((s, v) for s, v in loss.history if s <= step)
    if not hist:
        return LossSummary()
    # the history keeps every k-th loss on long runs; scale the count back to losses recorded
    scale = loss.n / len(loss.history) if loss.history else 1.0
    finite = [v for _, v in hist if math.isfinite(v)]
    nonfinite = [s for s, v in hist if not math.isfinite(v)]
    first_bad = loss.first_nonfinite_step
    seen_bad = first_bad is not None and first_bad <= step
    return LossSummary(n=max(len(hist), round(len(hist) * scale)), first=hist[0][1], last=hist[-1][1],
                       min=min(finite) if finite else None,
                       n_nonfinite=max(len(nonfinite), round(len(nonfinite) * scale)) if seen_bad else 0,
                       first_nonfinite_step=first_bad if seen_bad else None,
                       history=hist)


def trace_until(trace: Trace, step: int) -> Trace:
    """``trace`` as the monitor knew it at ``step``: events that started by then (ends and
    counts clipped to it), the losses recorded up to it and the signatures measured by then."""
    from neuraldbg.causal.nodes import signature_table

    events = []
    for e in trace.events:
        if e.step > step:
            continue
        if e.end_step > step:
            span = e.end_step - e.step + 1
            count = max(1, round(e.count * (step - e.step + 1) / span))
            e = dataclasses.replace(e, end_step=step, count=count)
        events.append(e)
    sigs = trace.signatures.known_by(step, signature_table(), trace.first_step, trace.last_step)
    return dataclasses.replace(trace, events=tuple(events), last_step=max(trace.first_step, min(step, trace.last_step)),
                               loss=_loss_until(trace.loss, step), signatures=sigs)


def _thin(xs: Sequence[int], k: int) -> list[int]:
    """At most ``k`` of the sorted ``xs``, evenly spaced, first and last kept."""
    if len(xs) <= k:
        return list(xs)
    if k <= 1:
        return list(xs[-1:]) if k == 1 else []
    return sorted({xs[round(i * (len(xs) - 1) / (k - 1))] for i in range(k)})


def checked_steps(trace: Trace, max_points: int = MAX_POINTS) -> list[int]:
    """The steps a timeline is evaluated at: every step with a recorded loss, every event
    onset and the last step, thinned evenly to ``max_points`` (onsets and the last kept first)."""
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2, got {max_points}")
    must = sorted({e.step for e in trace.events} | {trace.last_step})
    if len(must) >= max_points:
        return _thin(must, max_points)
    rest = sorted(({s for s, _ in trace.loss.history} | {trace.first_step}) - set(must))
    return sorted(set(must) | set(_thin(rest, max_points - len(must))))


def posterior_timeline(trace: Trace, priors: Any = None, steps: Sequence[int] | None = None,
                       max_points: int = MAX_POINTS) -> list[TimelinePoint]:
    """The posterior as of each of ``steps`` (default :func:`checked_steps`)."""
    from neuraldbg.causal import api

    pri = api.resolve_priors(trace, priors)
    out = []
    for s in (checked_steps(trace, max_points) if steps is None else sorted(set(int(x) for x in steps))):
        post = api.posterior(trace_until(trace, s), pri)
        out.append(TimelinePoint(step=s, p_healthy=post.p_healthy, abnormal=tuple(post.abnormal())))
    return out
