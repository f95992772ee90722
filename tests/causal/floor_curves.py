"""Loss histories and spike events for the readings of a classifier at its floor
(``neuraldbg/causal/nodes/floor.py``), shared by ``tests/causal/nodes/test_floor_nodes.py`` and
``tests/causal/nodes/test_loss_nodes.py``."""
from __future__ import annotations

import math

from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import OPTIMIZER, Event, make_event
from tests.tiny import make_trace

CHANCE = math.log(4)


def spike_event(step: int, peak: float, level: float, count: int = 1) -> Event:
    ev = make_event(OPTIMIZER, "spike", None, step, 12.0, {"loss": peak, "robust_z": 12.0, "window_median": level})
    if count == 1:
        return ev
    return Event(type=OPTIMIZER, kind="spike", layer=None, step=step, end_step=step + 5, count=count,
                 severity=12.0, values=ev.values)


def curve(n: int = 120, spike_at: int = 80, peak: float = 0.72, after: float = 0.009) -> list[float]:
    """A classifier that learned (1.39 to 0.012 by step 60), one batch's spike, then ``after``."""
    xs = [CHANCE * math.exp(-i / 12) + 0.01 for i in range(spike_at)]
    return xs + [peak] + [after] * (n - spike_at - 1)


def history(values: list[float]) -> tuple[tuple[int, float], ...]:
    return tuple(enumerate(values))


def trace_view(losses: list[float], events=(), **sigs) -> TraceView:
    return TraceView(make_trace(events=events, losses=losses, sigs=sigs))


# Regression: a healthy encoder resumed from its checkpoint with every state restored spiked
# from 5e-4 to 0.03, 0.28 and 0.05 on three single batches of 120 steps, each gone on the next;
# the monitor merged them into one spike event (count 3) whose later peaks it does not carry,
# and the run read learning_rate/too_high with its exploding gradients of the same batches.
FLOOR = 5e-4


def floor_curve(peaks: dict[int, float], n: int = 120, after: dict[int, float] | None = None) -> list[float]:
    xs = [FLOOR] * n
    for i, v in peaks.items():
        xs[i] = v
    for i, v in (after or {}).items():
        xs[i] = v
    return xs


def spike_episode(first: int, last: int, count: int, peak: float) -> Event:
    ev = make_event(OPTIMIZER, "spike", None, first, 12.0, {"loss": peak, "robust_z": 12.0, "window_median": FLOOR})
    return Event(type=OPTIMIZER, kind="spike", layer=None, step=first, end_step=last, count=count,
                 severity=12.0, values=ev.values)


PEAKS = {30: 0.03, 80: 0.28, 110: 0.05}


RESUMED = "not at initialization: AdamW already held state before its first step (a resumed run)"
