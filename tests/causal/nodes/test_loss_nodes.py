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


# Regression: a healthy encoder resumed from its checkpoint with every state restored spiked
# from 5e-4 to 0.03, 0.28 and 0.05 on three single batches of 120 steps, each gone on the next;
# the monitor merged them into one spike event (count 3) whose later peaks it does not carry,
# and the run read learning_rate/too_high with its exploding gradients of the same batches.
FLOOR = 5e-4


def _floor_curve(peaks: dict[int, float], n: int = 120, after: dict[int, float] | None = None) -> list[float]:
    xs = [FLOOR] * n
    for i, v in peaks.items():
        xs[i] = v
    for i, v in (after or {}).items():
        xs[i] = v
    return xs


def _episode(first: int, last: int, count: int, peak: float) -> Event:
    ev = make_event(OPTIMIZER, "spike", None, first, 12.0, {"loss": peak, "robust_z": 12.0, "window_median": FLOOR})
    return Event(type=OPTIMIZER, kind="spike", layer=None, step=first, end_step=last, count=count,
                 severity=12.0, values=ev.values)


PEAKS = {30: 0.03, 80: 0.28, 110: 0.05}


def test_a_merged_episode_s_later_peaks_are_read_from_the_history():
    from neuraldbg.causal.nodes.loss import LEVEL_POINTS, excursions, mistake_steps

    assert LEVEL_POINTS == 20  # the spike detector's window (NeuralDbgConfig.spike_window)
    hist = _history(_floor_curve(PEAKS))
    # every loss above 2x the median of the 20 before it: the three peaks, each with its level
    assert excursions(hist, 30, 110) == [(30, 0.03, FLOOR), (80, 0.28, FLOOR), (110, 0.05, FLOOR)]
    assert excursions(hist, 31, 79) == []
    episode = _episode(30, 110, 3, 0.03)
    assert mistake_steps([episode], hist, CHANCE) == frozenset(PEAKS)
    assert confident_mistakes([episode], hist, CHANCE)
    # a later peak at chance level, or one the loss stays up after (0.002 = 4x the floor for
    # the next five batches), is instability, although the first peak alone was a mistake
    assert mistake_steps([episode], _history(_floor_curve({**PEAKS, 80: 1.5})), CHANCE) is None
    stays_up = {i: 0.002 for i in range(81, 86)}
    assert mistake_steps([episode], _history(_floor_curve(PEAKS, after=stays_up)), CHANCE) is None
    # an occurrence the history does not hold (downsampled past it) cannot be read
    assert mistake_steps([_episode(30, 110, 4, 0.03)], hist, CHANCE) is None
    # the last peak at the run's last batches: what followed is unknown
    late = _history(_floor_curve({30: 0.03, 117: 0.05}))
    assert mistake_steps([_episode(30, 117, 2, 0.03)], late, CHANCE) is None


def test_loss_pattern_reads_a_run_of_single_batch_mistakes_calm():
    r = loss_pattern(_view(_floor_curve(PEAKS), [_episode(30, 110, 3, 0.03)], out_features=4))
    assert r.state == "flat" and "confident mistakes" in r.note


def test_exploding_gradients_of_the_mistaken_batches_only_are_no_evidence():
    """Regression: the healthy resumed encoder also exploded in its embedding at step 39, whose
    batch took the loss from 5e-4 to 1.1e-3 (no spike event: far below half the start level)."""
    from neuraldbg.causal.nodes.layers import batch_gradients, exploding
    from neuraldbg.causal.nodes.loss import mistaken_batch
    from neuraldbg.events.base import GRADIENT

    def expl(step: int, end: int | None = None, count: int = 1, layer: str = "fc1") -> Event:
        return Event(type=GRADIENT, kind="exploding", layer=layer, step=step, end_step=end, count=count, severity=3.0)

    peaks = {**PEAKS, 39: 2.2 * FLOOR}
    hist = _history(_floor_curve(peaks))
    assert all(mistaken_batch(hist, s, CHANCE) for s in peaks)
    assert not mistaken_batch(hist, 31, CHANCE)                       # no excursion there
    assert not mistaken_batch(hist, 39, None)                         # no chance level
    assert not mistaken_batch(_history(_floor_curve({**peaks, 80: 1.5})), 80, CHANCE)   # at chance
    stays_up = {i: 0.002 for i in range(81, 86)}
    assert not mistaken_batch(_history(_floor_curve(peaks, after=stays_up)), 80, CHANCE)  # stayed up
    assert not mistaken_batch(_history(_floor_curve({117: 0.05})), 117, CHANCE)        # nothing after it

    assert batch_gradients([expl(30), expl(39, layer="embed"), expl(80, layer="fc2"), expl(30, 80, count=2)],
                           hist, CHANCE)
    assert not batch_gradients([expl(30), expl(31)], hist, CHANCE)      # a step whose batch was no mistake
    assert not batch_gradients([expl(30, 110, count=3)], hist, CHANCE)  # a merged event's middle unknown
    assert not batch_gradients([expl(30)], hist, None) and not batch_gradients([], hist, CHANCE)

    episode = _episode(30, 110, 3, 0.03)
    view = _view(_floor_curve(peaks), [episode, expl(30), expl(39), expl(80)], out_features=4)
    r = exploding(view)
    assert r.state is None and "got wrong" in r.note
    # the same gradients beside a loss that went to chance level and stayed are evidence
    view = _view(_floor_curve({**peaks, 80: 1.5}, after=stays_up), [episode, expl(30), expl(80)], out_features=4)
    assert exploding(view).state == "later"


def test_a_loss_that_stays_near_chance_is_never_healthy():
    """Regression: the zoo's residual-free transformer ends at 0.89x chance after 200 steps with
    vanishing gradients; a latent signal decay's leak under every root ok explained it as a
    healthy run (P(healthy) 0.49, above architecture/unstable 0.44). A stall against chance level
    rules out the healthy run (never_healthy), as a precondition rules out a root state."""
    from neuraldbg.causal.compiled import HEALTHY_KEY
    from neuraldbg.causal.nodes.loss import never_healthy

    k = 4
    chance = math.log(k)
    stalled = [chance * (1.0 - 0.05 * i / 199) for i in range(200)]    # 1.39 -> 0.95x chance: stalled
    learned = [chance * math.exp(-i / 40) + 0.05 for i in range(200)]  # far below chance
    assert never_healthy(_view(stalled, out_features=k)) is not None
    assert "never healthy" in never_healthy(_view(stalled, out_features=k))
    assert never_healthy(_view(learned, out_features=k)) is None
    # against its own start (no chance level), a flat loss rules nothing out
    assert never_healthy(_view(stalled)) is None

    post = api.posterior(make_trace(losses=stalled, sigs={"out_features": k}))
    assert post.p_healthy == 0.0 and HEALTHY_KEY in post.ruled_out
    assert sum(post["unexplained"].values()) == pytest.approx(1.0)
    post = api.posterior(make_trace(losses=learned, sigs={"out_features": k}))
    assert post.p_healthy > 0.5 and HEALTHY_KEY not in post.ruled_out
