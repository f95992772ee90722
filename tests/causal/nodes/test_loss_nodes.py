"""Loss spikes that are a confident classifier's mistakes on one batch, not instability
(``neuraldbg/causal/nodes/loss.py``: ``confident_mistakes`` and ``loss_pattern``), on
hand-built traces.

Regression: a healthy 12-block post-norm encoder (the ecosystem's warm-up twin of
``no_warmup``) whose loss, at 0.012, jumped to 0.72 for one batch (chance: ln 4 = 1.39) and
was back at 0.009 on the next read ``learning_rate/too_high`` with ``P(healthy)`` 0.12.
"""
from __future__ import annotations

import math

import pytest

from neuraldbg.causal import api
from neuraldbg.causal.nodes.loss import RECOVER_FACTOR, RECOVER_POINTS, confident_mistakes, loss_pattern
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import OPTIMIZER, Event, make_event
from tests.tiny import make_trace

CHANCE = math.log(4)


def _spike(step: int, peak: float, level: float, count: int = 1) -> Event:
    ev = make_event(OPTIMIZER, "spike", None, step, 12.0, {"loss": peak, "robust_z": 12.0, "window_median": level})
    if count == 1:
        return ev
    return Event(type=OPTIMIZER, kind="spike", layer=None, step=step, end_step=step + 5, count=count,
                 severity=12.0, values=ev.values)


def _curve(n: int = 120, spike_at: int = 80, peak: float = 0.72, after: float = 0.009) -> list[float]:
    """A classifier that learned (1.39 to 0.012 by step 60), one batch's spike, then ``after``."""
    xs = [CHANCE * math.exp(-i / 12) + 0.01 for i in range(spike_at)]
    return xs + [peak] + [after] * (n - spike_at - 1)


def _history(values: list[float]) -> tuple[tuple[int, float], ...]:
    return tuple(enumerate(values))


def test_a_spike_below_chance_gone_on_the_next_batches_is_a_confident_mistake():
    assert (RECOVER_POINTS, RECOVER_FACTOR) == (5, 2.0)  # the cut points the cases are computed for
    hist = _history(_curve())
    assert confident_mistakes([_spike(80, 0.72, 0.012)], hist, CHANCE)
    # at or above chance level the model lost what it learned
    assert not confident_mistakes([_spike(80, CHANCE, 0.012)], hist, CHANCE)
    assert not confident_mistakes([_spike(80, 3.0, 0.012)], hist, CHANCE)
    # still up on the next batches: 0.03 against a level of 0.012 (2.5x)
    assert not confident_mistakes([_spike(80, 0.72, 0.012)], _history(_curve(after=0.03)), CHANCE)
    assert confident_mistakes([_spike(80, 0.72, 0.012)], _history(_curve(after=0.024)), CHANCE)
    # a merged episode's later peaks are unknown; no chance level (not a cross-entropy); no spike
    assert not confident_mistakes([_spike(80, 0.72, 0.012, count=3)], hist, CHANCE)
    assert not confident_mistakes([_spike(80, 0.72, 0.012)], hist, None)
    assert not confident_mistakes([], hist, CHANCE)
    # too few losses recorded after it to tell; every spike must qualify
    assert not confident_mistakes([_spike(117, 0.72, 0.012)], hist, CHANCE)
    assert not confident_mistakes([_spike(30, 0.72, 0.012), _spike(80, 2.0, 0.012)], hist, CHANCE)


def _view(losses: list[float], events=(), **sigs) -> TraceView:
    return TraceView(make_trace(events=events, losses=losses, sigs=sigs))


def test_loss_pattern_reads_the_curve_without_such_spikes_and_says_why():
    losses = _curve()
    spike = _spike(80, 0.72, 0.012)
    r = loss_pattern(_view(losses, [spike], out_features=4))
    assert r.state == "decreasing" and "confident mistakes" in r.note and "step 80" in r.note
    # without a chance level (a regression, a loss of unknown kind) a spike is a spike
    assert loss_pattern(_view(losses, [spike])).state == "spike"
    # a jump that stays up is one too
    assert loss_pattern(_view(_curve(after=0.5), [spike], out_features=4)).state == "spike"


def test_only_the_reading_of_the_spike_decides_healthy():
    """The same trace, with the spike read as a confident mistake (peak 0.72, below chance) or as
    instability (peak 2.0, above it): nothing else differs."""
    benign = make_trace(events=[_spike(80, 0.72, 0.012)], losses=_curve(), sigs={"out_features": 4})
    unstable = make_trace(events=[_spike(80, 2.0, 0.012)], losses=_curve(peak=2.0), sigs={"out_features": 4})
    p_benign = api.posterior(benign).p_healthy
    p_unstable = api.posterior(unstable).p_healthy
    assert p_benign > 0.5 > p_unstable


def test_pace_runs_on_hand_computed_curves():
    from neuraldbg.causal.nodes.loss import pace_runs

    # 40 values: the last half falls 0.01 per step from 1.0; its first and last eighths (5 values)
    # have medians 0.98 and 0.83, 15 steps apart: 0.01 per step. The tail (last 8) has (upper)
    # median 0.85; 0.35 to go to 0.5: 35 steps, 0.875 runs of 40 steps
    vals = [1.2] * 20 + [1.0 - 0.01 * i for i in range(20)]
    assert pace_runs(vals, 0.5) == pytest.approx(0.875)
    assert pace_runs([0.9] * 40, 0.5) == math.inf       # it stopped falling
    assert pace_runs([0.4] * 40, 0.5) == 0.0            # already there
    assert pace_runs([0.9] * 10, 0.5) is None           # too short to read a pace


def test_a_loss_that_stopped_near_chance_is_stalled_and_one_on_its_way_down_is_not():
    from neuraldbg.causal.nodes.loss import DRIFT_BAND, NEAR_CHANCE, PACE_RUNS, progress_state

    assert progress_state(0.85, True, pace=math.inf) == "stalled"
    assert progress_state(0.85, True, pace=PACE_RUNS + 1) == "stalled"
    assert progress_state(0.85, True, pace=1.5) == "learning"        # a slow learner, still on its way
    assert progress_state(0.85, True) == "learning"                  # no pace: the level alone
    assert progress_state(DRIFT_BAND - 0.01, True, pace=math.inf) == "learning"
    assert progress_state(NEAR_CHANCE, True, pace=0.1) == "stalled"  # within 10 %: never healthy
    assert progress_state(0.85, False, pace=math.inf) == "learning"  # against its own start: STALLED
