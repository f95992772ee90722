"""Trace -> evidence: each variable's cut points, and what counts as unobserved."""
import dataclasses

import pytest

from neuraldbg.causal import evidence as E
from neuraldbg.causal.nodes import data as data_nodes
from neuraldbg.causal.nodes import depth, layers
from neuraldbg.causal.nodes import loss as L
from neuraldbg.causal.view import INIT_STEPS
from neuraldbg.trace import LayerInfo, Trace
from scenarios import (SCENARIOS, act, data, decreasing, flat, grad, loss_event, mlp_layers, nan_inside, nan_sudden,
                       trace)
from tests.tiny import signatures


def obs(tr):
    return E.extract(tr).observed


def test_scenario_signatures():
    assert obs(SCENARIOS["healthy"][0]()) == {
        "exploding": "absent", "vanishing": "absent", "dead": "absent",  # ReLU MLP: no saturation watch
        "data_nan": "absent", "data_shift": "absent", "loss_start": "normal", "loss_pattern": "decreasing",
        "depth_risk": "low", "target_fault": "absent",  # no optimizer or weights recorded: no step/init signature
        "progress": "learning"}  # no loop signatures recorded either: the loop nodes are unobserved
    o = obs(SCENARIOS["lr_too_high"][0]())
    assert (o["exploding"], o["dead"], o["vanishing"], o["loss_pattern"], o["order"]) == \
        ("later", "later", "later", "divergence", "grad_first")
    o = obs(SCENARIOS["init_too_large"][0]())
    assert (o["exploding"], o["loss_start"]) == ("init", "high")
    assert obs(SCENARIOS["init_too_small"][0]())["vanishing"] == "init_uniform"
    o = obs(SCENARIOS["sigmoid_stack"][0]())
    assert (o["vanishing"], o["depth_risk"], o["loss_pattern"]) == ("init_depth", "deep_saturating", "flat")
    o = obs(SCENARIOS["nan_batch"][0]())
    assert (o["data_nan"], o["loss_pattern"]) == ("input", "nonfinite")
    assert obs(nan_inside())["data_nan"] == "inside_after"
    o = obs(SCENARIOS["data_shift"][0]())
    assert (o["data_shift"], o["order"], o["exploding"]) == ("input", "same_step", "later")


def test_empty_trace_observes_nothing():
    tr = Trace(events=(), layers=(), family="mlp")
    assert obs(tr) == {}


def test_activation_absences_need_the_matching_modules():
    assert "saturation" not in obs(trace([], layers=mlp_layers(3, "ReLU")))
    assert obs(trace([], layers=mlp_layers(3, "Tanh")))["saturation"] == "absent"
    assert "dead" not in obs(trace([], layers=mlp_layers(3, "Tanh")))
    assert obs(trace([], layers=mlp_layers(3, "ReLU")))["dead"] == "absent"


def test_absence_is_evidence_only_where_a_detector_watched():
    layers_no_params = tuple(dataclasses.replace(li, n_params=0) for li in mlp_layers())
    o = obs(trace([], layers=layers_no_params))
    assert "exploding" not in o and "vanishing" not in o  # no parameter gradients monitored
    assert o["dead"] == "absent" and "loss_pattern" not in o  # no loss recorded


def test_onset_phase_cut_is_the_first_checked_step():
    assert obs(trace([grad("exploding", "2", 0)]))["exploding"] == "init"
    assert obs(trace([grad("exploding", "2", INIT_STEPS)]))["exploding"] == "later"
    late_start = dataclasses.replace(trace([grad("exploding", "2", 100)]), first_step=100, last_step=160)
    assert obs(late_start)["exploding"] == "init"
    every = dataclasses.replace(trace([grad("exploding", "2", 4)]), signatures=signatures({"every": 5}))
    assert obs(every)["exploding"] == "init"  # the first checked step when checking every 5


def test_vanishing_signal_scale_cut():
    small = trace([grad("vanishing", "0", 0, out_rms=layers.SMALL_SIGNAL / 10)])
    normal = trace([grad("vanishing", "0", 0, out_rms=layers.SMALL_SIGNAL * 10)])
    unknown = trace([grad("vanishing", "0", 0)])
    assert obs(small)["vanishing"] == "init_uniform"
    assert obs(normal)["vanishing"] == "init_depth"
    assert obs(unknown)["vanishing"] == ("init_depth", "init_uniform")  # partial observation
    assert obs(trace([grad("vanishing", "0", 9, out_rms=1e-5)]))["vanishing"] == "later"


def test_saturation_phase_and_coupling_with_vanishing():
    near = trace([act("saturated", "1", 0, 50), grad("vanishing", "2", 0, 50)])
    far_layer = trace([act("saturated", "1", 0, 50), grad("vanishing", "8", 0, 50)],
                      layers=mlp_layers(5, "Sigmoid"))
    far_time = trace([act("saturated", "1", 0, 5), grad("vanishing", "2", 40, 50)])
    later = trace([act("saturated", "1", 16, 50), grad("vanishing", "2", 20, 50)])
    much_later_vanishing = trace([act("saturated", "1", 0, 50), grad("vanishing", "2", 30, 50)])
    assert obs(much_later_vanishing)["saturation"] == "init"  # overlapping spans are not coupling
    assert obs(near)["saturation"] == "init_vanishing"
    assert obs(far_layer)["saturation"] == "init"
    assert obs(far_time)["saturation"] == "init"
    assert obs(later)["saturation"] == "later"
    ev = E.extract(near)
    assert {e.kind for e in ev.support["saturation"]} == {"saturated", "vanishing"}


def test_first_step_is_not_init_for_alternating_families():
    tr = trace([grad("exploding", "0", 0), act("dead", "1", 0, 9)], family="gan")
    o = obs(tr)
    assert o["exploding"] == ("init", "later") and o["dead"] == ("init", "later")
    assert obs(trace([grad("exploding", "0", 0)], family="cnn"))["exploding"] == "init"


def test_nan_origin_reads_at_input_flag_then_layer_position():
    assert obs(trace([data("nan", "0", 5, at_input=1.0)]))["data_nan"] == "input"
    assert obs(trace([data("inf", "2", 5, at_input=0.0)]))["data_nan"] == "inside_sudden"
    assert obs(trace([data("nan", "0", 5)]))["data_nan"] == "input"  # no flag: first layer
    assert obs(trace([data("nan", "4", 5)]))["data_nan"] == "inside_sudden"
    # the earliest NaN decides, not the shallowest
    both = trace([data("nan", "4", 5, at_input=0.0), data("nan", "0", 9, at_input=1.0)])
    assert obs(both)["data_nan"] == "inside_sudden"


def test_nan_inside_after_instability_vs_sudden():
    assert obs(nan_inside())["data_nan"] == "inside_after"
    assert obs(nan_sudden())["data_nan"] == "inside_sudden"
    stale = trace([grad("exploding", "2", 3, 5), data("nan", "2", 5 + data_nodes.SUDDEN_WINDOW + 1, at_input=0.0)])
    assert obs(stale)["data_nan"] == "inside_sudden"  # growth long gone is not the cause


def test_shift_is_unobserved_behind_token_embeddings():
    layers = (LayerInfo("wte", "Embedding", 0, 4096),) + tuple(
        dataclasses.replace(li, index=li.index + 1) for li in mlp_layers())
    assert "data_shift" not in obs(trace([], layers=layers))
    assert obs(trace([], layers=layers))["data_nan"] == "absent"


def test_shift_at_input_vs_inside():
    assert obs(trace([data("shift", "0", 20)]))["data_shift"] == "input"
    assert obs(trace([data("shift", "2", 20)]))["data_shift"] == "inside"


@pytest.mark.parametrize("losses,events,expected", [
    (decreasing(), [], "decreasing"),
    ([0.7 - 0.0008 * i for i in range(60)], [], "slow"),
    (flat(), [], "flat"),
    (decreasing(), [loss_event("plateau", 50)], "flat"),
    (decreasing(), [loss_event("spike", 30)], "spike"),
    (decreasing(), [loss_event("spike", 30), loss_event("divergence", 40)], "divergence"),
    (decreasing(30) + [float("nan")] * 30, [], "nonfinite"),
    (decreasing(), [loss_event("divergence", 40, nonfinite=1.0)], "nonfinite"),
    (decreasing(10), [], L.CALM_LOSS),  # too short to tell progress
])
def test_loss_pattern(losses, events, expected):
    assert obs(trace(events, losses=losses))["loss_pattern"] == expected


def test_loss_progress_is_not_evidence_for_adversarial_families():
    assert obs(trace([], losses=flat(), family="gan"))["loss_pattern"] == L.CALM_LOSS


def test_game_swings_are_not_instability_but_a_runaway_loss_is():
    """Regression: healthy GAN/RL runs raise spike and divergence events from the game's own
    swings; only a loss that leaves GAME_BAND x its start is a blow-up."""
    swinging = [1.0, 2.0] * 30  # 2x swings: the game
    assert obs(trace([loss_event("spike", 9)], losses=swinging, family="rl"))["loss_pattern"] == L.CALM_LOSS
    assert obs(trace([loss_event("divergence", 9)], losses=swinging, family="gan"))["loss_pattern"] == L.CALM_LOSS
    runaway = [1.0] * 30 + [10.0 ** (i / 5) for i in range(30)]  # up to ~1e6x, no event raised
    assert obs(trace([], losses=runaway, family="gan"))["loss_pattern"] == "divergence"
    just_inside = [1.0] * 30 + [L.GAME_BAND * 0.9] * 30
    assert obs(trace([], losses=just_inside, family="gan"))["loss_pattern"] == L.CALM_LOSS
    assert L.loss_rise(trace([], losses=[2.0] * 20 + [100.0] + [2.0] * 19)) == pytest.approx(50.0)
    # too few finite points: the band cannot be read
    assert L.loss_rise(trace([], losses=[1.0, float("nan")] * 4)) is None


def test_loss_start():
    assert obs(trace([], losses=[500.0] + [1.0] * 59))["loss_start"] == "high"
    assert obs(trace([], losses=decreasing(60, 2.3, 0.05)))["loss_start"] == "normal"
    assert "loss_start" not in obs(trace([], losses=[500.0, 1.0, 1.0]))  # too few points
    shifted = dataclasses.replace(trace([], losses=[500.0] + [1.0] * 59), first_step=3)
    assert "loss_start" not in obs(shifted)  # the first recorded loss is not the first step
    assert "loss_start" not in obs(trace([], losses=[-5.0] + [-1.0] * 59))


def test_order_needs_both_exploding_and_loss_instability():
    assert "order" not in obs(trace([grad("exploding", "0", 3)], losses=decreasing()))
    assert obs(trace([grad("exploding", "0", 3), loss_event("spike", 3)]))["order"] == "same_step"
    assert obs(trace([grad("exploding", "0", 5), loss_event("spike", 3)]))["order"] == "loss_first"
    nonfinite = trace([grad("exploding", "0", 3)], losses=decreasing(20) + [float("nan")] * 40)
    assert obs(nonfinite)["order"] == "grad_first"


def test_depth_risk_cut_points():
    assert depth.depth_risk_state(trace([], layers=mlp_layers(3, "Sigmoid"))) == "low"
    assert depth.depth_risk_state(trace([], layers=mlp_layers(depth.SATURATING_DEPTH + 1, "Tanh"))) == "deep_saturating"
    assert depth.depth_risk_state(trace([], layers=mlp_layers(depth.DEEP_LAYERS, "ReLU"))) == "deep"
    normed = mlp_layers(depth.DEEP_LAYERS, "ReLU") + (LayerInfo("ln", "LayerNorm", 99, 128),)
    assert depth.depth_risk_state(trace([], layers=normed)) == "low"
    assert depth.depth_risk_state(Trace(events=(), layers=(), family="mlp")) is None


def test_notes_explain_each_observation():
    ev = E.extract(SCENARIOS["nan_batch"][0]())
    assert "step 30" in ev.notes["data_nan"] and "input" in ev.notes["data_nan"]
    assert set(ev.notes) >= {"data_nan", "loss_pattern", "depth_risk"}
