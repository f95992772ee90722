"""The nodes that read a confident classifier's mistakes on single batches, or its gradients at
its floor, as no instability (``loss_pattern``, ``exploding``, ``order``; the pure functions of
``neuraldbg/causal/nodes/floor.py`` in ``test_floor_nodes.py``), and the loss's progress, on
hand-built traces.

Regression: a healthy 12-block post-norm encoder (the ecosystem's warm-up twin of
``no_warmup``) whose loss, at 0.012, jumped to 0.72 for one batch (chance: ln 4 = 1.39) and
was back at 0.009 on the next read ``learning_rate/too_high`` with ``P(healthy)`` 0.12.
"""
from __future__ import annotations

import math

import pytest

from neuraldbg.causal import api
from neuraldbg.causal.nodes.loss import loss_pattern
from neuraldbg.events.base import OPTIMIZER, Event, make_event
from tests.causal.floor_curves import (CHANCE, FLOOR, PEAKS, RESUMED, curve, floor_curve, history, spike_episode,
                                      spike_event, trace_view)
from tests.tiny import make_trace

def test_loss_pattern_reads_the_curve_without_such_spikes_and_says_why():
    losses = curve()
    spike = spike_event(80, 0.72, 0.012)
    r = loss_pattern(trace_view(losses, [spike], out_features=4))
    assert r.state == "decreasing" and "confident mistakes" in r.note and "step 80" in r.note
    # without a chance level (a regression, a loss of unknown kind) a spike is a spike
    assert loss_pattern(trace_view(losses, [spike])).state == "spike"
    # a jump that stays up is one too
    assert loss_pattern(trace_view(curve(after=0.5), [spike], out_features=4)).state == "spike"


def test_only_the_reading_of_the_spike_decides_healthy():
    """The same trace, with the spike read as a confident mistake (peak 0.72, below chance) or as
    instability (peak 2.0, above it): nothing else differs."""
    benign = make_trace(events=[spike_event(80, 0.72, 0.012)], losses=curve(), sigs={"out_features": 4})
    unstable = make_trace(events=[spike_event(80, 2.0, 0.012)], losses=curve(peak=2.0), sigs={"out_features": 4})
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


def test_loss_pattern_reads_a_run_of_single_batch_mistakes_calm():
    r = loss_pattern(trace_view(floor_curve(PEAKS), [spike_episode(30, 110, 3, 0.03)], out_features=4))
    assert r.state == "flat" and "confident mistakes" in r.note


def test_exploding_gradients_of_the_mistaken_batches_only_are_no_evidence():
    """Regression: the healthy resumed encoder also exploded in its embedding at step 39, whose
    batch took the loss from 5e-4 to 1.1e-3 (no spike event: far below half the start level)."""
    from neuraldbg.causal.nodes.floor import batch_gradients, mistaken_batch
    from neuraldbg.causal.nodes.layers import exploding
    from neuraldbg.events.base import GRADIENT

    def expl(step: int, end: int | None = None, count: int = 1, layer: str = "fc1") -> Event:
        return Event(type=GRADIENT, kind="exploding", layer=layer, step=step, end_step=end, count=count, severity=3.0)

    peaks = {**PEAKS, 39: 2.2 * FLOOR}
    hist = history(floor_curve(peaks))
    assert all(mistaken_batch(hist, s, CHANCE) for s in peaks)
    assert not mistaken_batch(hist, 31, CHANCE)                       # no excursion there
    assert not mistaken_batch(hist, 39, None)                         # no chance level
    assert not mistaken_batch(history(floor_curve({**peaks, 80: 1.5})), 80, CHANCE)   # at chance
    stays_up = {i: 0.002 for i in range(81, 86)}
    assert not mistaken_batch(history(floor_curve(peaks, after=stays_up)), 80, CHANCE)  # stayed up
    assert not mistaken_batch(history(floor_curve({117: 0.05})), 117, CHANCE)        # nothing after it

    assert batch_gradients([expl(30), expl(39, layer="embed"), expl(80, layer="fc2"), expl(30, 80, count=2)],
                           hist, CHANCE)
    assert not batch_gradients([expl(30), expl(31)], hist, CHANCE)      # a step whose batch was no mistake
    assert not batch_gradients([expl(30, 110, count=3)], hist, CHANCE)  # a merged event's middle unknown
    assert not batch_gradients([expl(30)], hist, None) and not batch_gradients([], hist, CHANCE)

    episode = spike_episode(30, 110, 3, 0.03)
    view = trace_view(floor_curve(peaks), [episode, expl(30), expl(39), expl(80)], out_features=4)
    r = exploding(view)
    assert r.state is None and "got wrong" in r.note
    # the same gradients beside a loss that went to chance level and stayed are evidence
    view = trace_view(floor_curve({**peaks, 80: 1.5}, after=stays_up), [episode, expl(30), expl(80)], out_features=4)
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
    assert never_healthy(trace_view(stalled, out_features=k)) is not None
    assert "never healthy" in never_healthy(trace_view(stalled, out_features=k))
    assert never_healthy(trace_view(learned, out_features=k)) is None
    # against its own start (no chance level), a flat loss rules nothing out
    assert never_healthy(trace_view(stalled)) is None

    post = api.posterior(make_trace(losses=stalled, sigs={"out_features": k}))
    assert post.p_healthy == 0.0 and HEALTHY_KEY in post.ruled_out
    assert sum(post["unexplained"].values()) == pytest.approx(1.0)
    post = api.posterior(make_trace(losses=learned, sigs={"out_features": k}))
    assert post.p_healthy > 0.5 and HEALTHY_KEY not in post.ruled_out


def test_exploding_gradients_at_the_floor_of_a_run_entered_there_are_no_evidence():
    """Regression: a healthy encoder resumed from its checkpoint with every state restored formed
    its gradient baselines at its floor (the positional embedding's 5.7e-7); at step 17 one batch
    grew it 126x (7.3e-5) while the loss stayed at 5.8e-4 (the floor 4.8e-4), and the run read
    ``learning_rate/too_high`` 0.27-0.64 beside healthy."""
    from neuraldbg.causal.nodes.floor import batch_gradients
    from neuraldbg.causal.nodes.layers import exploding
    from neuraldbg.causal.nodes.order import order
    from neuraldbg.events.base import GRADIENT

    def expl(step: int, layer: str = "pos") -> Event:
        return make_event(GRADIENT, "exploding", layer, step, 2.1, {"growth": 126.0})

    peaks = {12: 0.029, 17: 1.2 * FLOOR, 39: 2.3 * FLOOR}
    hist = history(floor_curve(peaks))
    events = [expl(12), expl(17), expl(39, "embed")]
    assert not batch_gradients(events, hist, CHANCE)             # step 17's batch was no mistake
    assert batch_gradients(events, hist, CHANCE, FLOOR)          # ... but it stayed at the floor
    assert not batch_gradients(events, hist, None, FLOOR)        # no chance level

    # a later divergence (say) would make the order observed: the gradients are no instability
    div = make_event(OPTIMIZER, "divergence", None, 100, 3.0, {"loss": 0.4})
    resumed = trace_view(floor_curve(peaks), [*events, div], started_trained=RESUMED, out_features=4)
    r = exploding(resumed)
    assert r.state is None and "got wrong" in r.note
    assert order(resumed).state is None
    # the same events in a run that started at initialization (its baselines are not a floor's)
    fresh = trace_view(floor_curve(peaks), [*events, div], out_features=4)
    assert exploding(fresh).state == "later" and order(fresh).state == "grad_first"
    # ... and in a resumed run whose loss leaves its floor after them: instability
    risen = floor_curve(peaks, after={i: 0.05 for i in range(18, 60)})
    assert exploding(trace_view(risen, events, started_trained=RESUMED, out_features=4)).state == "later"


def test_order_does_not_read_spikes_that_were_a_confident_model_s_mistakes():
    from neuraldbg.causal.nodes.order import order
    from neuraldbg.events.base import GRADIENT

    # gradients exploding at 70 on a run whose one spike (80) was a mistaken batch: no instability
    grad = make_event(GRADIENT, "exploding", "fc1", 70, 3.0, {"growth": 500.0})
    view = trace_view(curve(), [grad, spike_event(80, 0.72, 0.012)], out_features=4)
    assert order(view).state is None
    # the same spike at chance level is instability, after the gradients
    view = trace_view(curve(peak=2.0), [grad, spike_event(80, 2.0, 0.012)], out_features=4)
    assert order(view).state == "grad_first"
