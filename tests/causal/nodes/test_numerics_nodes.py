"""The numerics evidence (``neuraldbg/causal/nodes/numerics.py``): the birthplace of the first
non-finite value, the weights' precision and the share of updates lost, on hand-made values."""
from __future__ import annotations

import pytest

from neuraldbg.causal import api
from neuraldbg.causal.nodes.numerics import (LOST_SHARE, ORIGINS, birthplace, update_lost_state,
                                             weights_precision_state)
from neuraldbg.trace import LayerInfo
from tests.tiny import make_trace

LAYERS = (LayerInfo("fc1", "Linear", 0, 80), LayerInfo("fc2", "Linear", 1, 40))
FALLING = [1.0 - 0.004 * i for i in range(100)]


def none(**given):
    return {**{o: None for o in ORIGINS}, **given}


@pytest.mark.parametrize("origin", ORIGINS)
def test_an_origin_seen_alone_is_the_birthplace(origin):
    assert birthplace(none(**{origin: 7})) == (origin, 7)


def test_the_earliest_step_wins_whatever_the_origin():
    assert birthplace(none(input=9, update=4, backward=6)) == ("update", 4)
    assert birthplace(none(forward=3, targets=5)) == ("forward", 3)


def test_ties_go_to_the_origin_earlier_in_a_step():
    # a NaN input makes the forward, the loss and the gradients non-finite in the same step
    assert birthplace(none(input=5, forward=5, targets=5, backward=5)) == ("input", 5)
    assert birthplace(none(forward=5, targets=5, backward=5)) == ("forward", 5)
    assert birthplace(none(targets=5, backward=5)) == ("targets", 5)
    # weights an update made non-finite are dated at the forward that runs on them: born before it
    assert birthplace(none(forward=5, update=5, backward=5)) == ("update", 5)
    # but a NaN input at that step came first still
    assert birthplace(none(input=5, update=5)) == ("input", 5)


def test_no_origin_no_birthplace():
    assert birthplace(none()) is None


def test_precision_states():
    assert weights_precision_state("bfloat16") == "half"
    assert weights_precision_state("float16") == "half"
    assert weights_precision_state("float32") == "full"
    assert weights_precision_state("float64") == "full"
    assert weights_precision_state(None) is None


def test_update_lost_cut():
    assert update_lost_state(None) is None
    assert update_lost_state(LOST_SHARE) == "lost"
    assert update_lost_state(0.88) == "lost"
    assert update_lost_state(0.06) == "moved"


def _ev(**sigs):
    return api.evidence(make_trace(layers=LAYERS, losses=FALLING, sigs=sigs))


def test_update_lost_is_read_on_half_precision_weights_only():
    assert _ev(weights_dtype="bfloat16", update_lost_share=0.9).observed["update_lost"] == "lost"
    assert _ev(weights_dtype="bfloat16", update_lost_share=0.1).observed["update_lost"] == "moved"
    ev = _ev(weights_dtype="float32", update_lost_share=0.9)
    assert "update_lost" not in ev.observed and "float32" in ev.unobserved["update_lost"]
    assert _ev(weights_dtype="float16").observed["weights_precision"] == "half"


def test_update_and_backward_births_are_read_from_their_signatures():
    assert _ev(nonfinite_weights_step=3).observed["data_nan"] == "update"
    assert _ev(nonfinite_grad_step=2, nonfinite_weights_step=3).observed["data_nan"] == "backward"


def test_preconditions_rule_out_what_the_run_lacks():
    calm = make_trace(layers=LAYERS, losses=FALLING, sigs={"weights_dtype": "float32"})
    post = api.posterior(calm)
    assert post["numerics"]["overflow"] == 0.0 and post["numerics"]["updates_lost"] == 0.0
    assert {("numerics", "overflow"), ("numerics", "updates_lost")} <= set(post.ruled_out)
    born = make_trace(layers=LAYERS, losses=FALLING, sigs={"weights_dtype": "float16", "nonfinite_weights_step": 3})
    post = api.posterior(born)
    # a NaN the optimizer made is no corrupted data
    assert post["data"]["corrupted"] == 0.0 and post["numerics"]["overflow"] > 0.5
