"""Runs entered on trained weights, and progress read against the run's own floor, on hand-built
traces: no first-step reading speaks for the initialization (``layers.py``' phases, ``loss_start``,
``init_scale``, the ``initialization`` precondition), a fine-tune at its floor is no stall
(``loss_pattern``), and a slow drift that ends near chance is (``progress``)."""
from __future__ import annotations

import math

import pytest

from neuraldbg.causal import api
from neuraldbg.causal.nodes.causes import init_scale, lacks_initialization
from neuraldbg.causal.nodes.layers import TRAINED_ENTRY, at_init, dead, exploding, saturation, vanishing
from neuraldbg.causal.nodes.floor import starts_at_floor
from neuraldbg.causal.nodes.loss import (CALM_LOSS, loss_pattern_reading, loss_start, near_chance_drift, progress,
                                         progress_state)
from neuraldbg.causal.nodes.run import not_at_init, started_trained
from neuraldbg.causal.view import TraceView
from neuraldbg.trace import Signatures
from tests.causal.scenarios import act, decreasing, flat, grad, mlp_layers, trace

RESUMED = "not at initialization: resumed from a checkpoint at step 15"
CHANCE = math.log(4)


def _sigs(trained: bool, **more) -> dict:
    return {**({"started_trained": RESUMED} if trained else {}), **more}


def test_the_reason_names_why_and_what():
    assert not_at_init(RESUMED, "x") == ("not at initialization: the run was entered on trained weights (resumed from "
                                         "a checkpoint at step 15); x")
    assert not_at_init("loaded from my_run.pt", "y") == ("not at initialization: the run was entered on trained "
                                                        "weights (loaded from my_run.pt); y")
    assert started_trained(Signatures({"started_trained": RESUMED})) == RESUMED
    assert started_trained(Signatures({})) is None


@pytest.mark.parametrize("trained", [False, True])
def test_layer_events_on_the_first_step_read_later_on_trained_weights(trained):
    sat = TraceView(trace([act("saturated", "1", 0)], layers=mlp_layers(act="Tanh"), sigs=_sigs(trained)))
    expl = TraceView(trace([grad("exploding", "0", 0)], sigs=_sigs(trained)))
    dd = TraceView(trace([act("dead", "1", 0)], sigs=_sigs(trained)))
    van = TraceView(trace([grad("vanishing", "0", 0, out_rms=0.5)], losses=flat(), sigs=_sigs(trained)))
    assert at_init(sat, 0) is not trained and not at_init(sat, 1)
    want = "later" if trained else None
    assert saturation(sat).state == (want or "init")
    assert exploding(expl).state == (want or "init")
    assert dead(dd).state == (want or "init")
    assert vanishing(van).state == (want or "init_depth")
    for r in (saturation(sat), exploding(expl), dead(dd), vanishing(van)):
        assert r.note.endswith(TRAINED_ENTRY) is trained


def test_a_later_onset_is_later_either_way():
    for trained in (False, True):
        view = TraceView(trace([grad("exploding", "0", 30)], sigs=_sigs(trained)))
        r = exploding(view)
        assert r.state == "later" and TRAINED_ENTRY not in r.note


def test_the_first_loss_of_trained_weights_is_no_evidence():
    blown = [40.0] + decreasing()[1:]
    assert loss_start(TraceView(trace([], losses=blown, sigs={"out_features": 4}))).state == "high"
    r = loss_start(TraceView(trace([], losses=blown, sigs=_sigs(True, out_features=4))))
    assert r.state is None
    assert r.reason == not_at_init(RESUMED, "its first loss is not that of an initialization")


def test_the_scale_of_trained_weights_is_never_read():
    fresh = TraceView(trace([], sigs={"init_scale_log10": 2.0, "init_scale_n": 3}))
    assert init_scale(fresh).state == "large"
    r = init_scale(TraceView(trace([], sigs=_sigs(True, init_scale_log10=2.0, init_scale_n=3))))
    assert r.state is None and r.gap
    assert r.reason == not_at_init(RESUMED, "the scale of trained weights says nothing of their initialization")


def test_the_initialization_is_ruled_out_on_trained_weights():
    view = TraceView(trace([], sigs=_sigs(True)))
    assert lacks_initialization(view) == not_at_init(RESUMED, "nothing it shows comes from an initialization")
    assert lacks_initialization(TraceView(trace([]))) is None
    out = api.impossible(trace([act("saturated", "1", 0)], layers=mlp_layers(act="Tanh"), sigs=_sigs(True)))
    assert {("initialization", "too_small"), ("initialization", "too_large")} <= set(out)
    fresh = api.impossible(trace([act("saturated", "1", 0)], layers=mlp_layers(act="Tanh")))
    assert not {("initialization", "too_small"), ("initialization", "too_large")} & set(fresh)


def test_starts_at_floor_on_hand_set_curves():
    assert starts_at_floor([0.1] * 20, CHANCE)              # 0.1 < 0.5 * 1.386
    assert not starts_at_floor([0.7] * 20, CHANCE)          # 0.7 >= 0.693
    assert starts_at_floor([0.7] * 20, None)                # no chance level: nothing says it is far off
    assert not starts_at_floor([0.1, 0.1], CHANCE)          # too short to read


def test_a_flat_fine_tune_at_its_floor_is_no_stall():
    at_floor = flat(level=0.08)
    r = loss_pattern_reading(TraceView(trace([], losses=at_floor, sigs=_sigs(True, out_features=4))))
    assert r.state == CALM_LOSS and "at its floor" in r.note
    # the same curve from a fresh start, or a trained run flat near chance: still flat
    assert loss_pattern_reading(TraceView(trace([], losses=at_floor, sigs={"out_features": 4}))).state == "flat"
    near = flat(level=0.9 * CHANCE)
    assert loss_pattern_reading(TraceView(trace([], losses=near, sigs=_sigs(True, out_features=4)))).state == "flat"


def test_progress_state_bands():
    assert progress_state(0.93, True) == "stalled"     # within NEAR_CHANCE (0.9) of chance
    assert progress_state(0.87, True) == "learning"
    assert progress_state(0.87, False) == "learning"   # against its own start: STALLED (0.9)
    assert progress_state(0.9, False) == "stalled"


def _drift(n=60, to=0.93):
    return [CHANCE * (1 - (1 - to) * i / (n - 1)) for i in range(n)]


def test_near_chance_drift_on_a_hand_set_curve():
    # the tail is the upper median of the last 12 values (i = 48..59, falling): sorted up, the 7th is i = 53
    assert near_chance_drift(_drift(), CHANCE) == pytest.approx(1 - 0.07 * 53 / 59)
    assert near_chance_drift(_drift(to=0.87), CHANCE) is None         # 0.87x: outside the band
    assert near_chance_drift(_drift(to=0.5), CHANCE) is None          # ends far below chance
    assert near_chance_drift([3 * CHANCE] * 10 + _drift()[10:], CHANCE) is None   # a blown-up start
    assert near_chance_drift(_drift(), None) is None
    assert near_chance_drift(_drift(n=10), CHANCE) is None            # too short


def test_a_slow_drift_near_chance_reads_slow_and_stalled():
    view = TraceView(trace([], losses=_drift(), sigs={"out_features": 4}))
    r = loss_pattern_reading(view)
    assert r.state == "slow"
    assert progress(view).state == "stalled"
    post = api.posterior(trace([], losses=_drift(), sigs={"out_features": 4}))
    assert post.p_healthy < 0.5
