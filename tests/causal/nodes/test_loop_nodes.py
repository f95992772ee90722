"""The training-loop nodes and the progress ratio as pure functions, on hand-computed values and
hand-built traces (``neuraldbg/causal/nodes/loop.py``, ``neuraldbg/causal/nodes/loss.py``).

Named ``test_loop_nodes.py``: the tests have no packages, so a second ``test_loop.py`` (the
measurement's, ``tests/monitor/measurements/``) would clash on import.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from neuraldbg.causal import api
from neuraldbg.causal.nodes import loop as L
from neuraldbg.causal.nodes.loss import MIN_LOSS_POINTS, progress, progress_ratio
from neuraldbg.causal.view import TraceView
from tests.tiny import make_trace

# ---- stale_state --------------------------------------------------------------------------


def test_stale_state_needs_two_stale_steps_and_a_quarter_of_those_examined():
    assert L.STALE_MIN == 2 and L.STALE_SHARE == 0.25  # the cut points the cases below are computed for
    assert L.stale_state(15, 16) == "present"      # zero_grad never called: every step but the first
    assert L.stale_state(2, 8) == "present"        # exactly 2 and exactly a quarter
    assert L.stale_state(2, 9) == "absent"         # 2 < 0.25 x 9 = 2.25
    assert L.stale_state(1, 1) == "absent"         # one stale step is not enough
    assert L.stale_state(0, 16) == "absent"        # accumulation, zeroed before every step
    assert L.stale_state(4, 16) == "present"       # a loop that forgets zero_grad every 4th step


def test_stale_state_is_unmeasured_without_examined_steps():
    assert L.stale_state(None, 16) is None
    assert L.stale_state(0, 0) is None
    assert L.stale_state(0, None) is None


# ---- softmax_floor ------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3, 10, 1000])
def test_softmax_floor_is_the_cross_entropy_of_a_one_hot_softmaxed_again(k):
    # the best a softmax in front of CrossEntropyLoss can do: rows one-hot, softmaxed once more
    assert L.softmax_floor(k) == pytest.approx(math.log(1 + (k - 1) / math.e), rel=1e-12)
    one_hot = torch.zeros(1, k, dtype=torch.float64)
    one_hot[0, 0] = 1.0
    ce = F.cross_entropy(one_hot, torch.tensor([0])).item()
    assert ce == pytest.approx(L.softmax_floor(k), rel=1e-12)


def test_softmax_floor_by_hand():
    assert L.softmax_floor(2) == pytest.approx(math.log(1 + 1 / math.e))   # 0.3133
    assert L.softmax_floor(3) == pytest.approx(0.5514, abs=1e-4)           # ln(1 + 2/e)
    assert L.softmax_floor(10) == pytest.approx(1.4612, abs=1e-4)          # ln(1 + 9/e)


def test_no_probability_row_reaches_below_the_floor():
    # any probability rows, through cross_entropy, stay at or above ln(1 + (K-1)/e)
    gen = torch.Generator().manual_seed(0)
    for k in (2, 3, 7):
        p = torch.softmax(torch.randn(256, k, generator=gen) * 20, dim=-1)
        y = p.argmax(-1)
        ce = F.cross_entropy(p, y, reduction="none")
        assert ce.min().item() >= L.softmax_floor(k) - 1e-6


# ---- the progress ratio (nodes/loss.py) ---------------------------------------------------


def test_progress_ratio_against_chance_on_hand_computed_values():
    chance = math.log(3)
    # 20 points: the tail is the last max(3, 20 x 0.2) = 4, its upper median (a value that occurred) 0.4
    vals = [1.1] * 16 + [0.5, 0.2, 0.4, 0.3]
    ratio, ref, what = progress_ratio(vals, chance)
    assert ratio == pytest.approx(0.4 / chance) and ref == chance and what == "chance level"


def test_progress_ratio_against_its_own_start_without_chance():
    # 40 points: the head is the first max(3, 40 x 0.1) = 4, upper median of [4, 2, 3, 1] = 3;
    # the tail the last 8, upper median of seven 1.0 and one 0.5 = 1.0
    vals = [4.0, 2.0, 3.0] + [1.0] * 36 + [0.5]
    ratio, ref, what = progress_ratio(vals, None)
    assert ref == 3.0 and what == "its start"
    assert ratio == pytest.approx(1.0 / 3.0)


def test_progress_ratio_unreadable_cases():
    assert progress_ratio([1.0] * (MIN_LOSS_POINTS - 1), math.log(3)) is None   # too short
    assert progress_ratio([0.0] * MIN_LOSS_POINTS, None) is None                # no positive reference


def test_progress_reads_stalled_at_nine_tenths_of_chance():
    k = 3
    near = [math.log(k) * 0.95] * 30
    far = [math.log(k)] * 10 + [0.1] * 20
    read = lambda vals: progress(TraceView(make_trace(losses=vals, sigs={"out_features": k}))).state  # noqa: E731
    assert read(near) == "stalled" and read(far) == "learning"


# ---- the readers, on hand-built traces ----------------------------------------------------


def _view(sigs, losses=None):
    return TraceView(make_trace(losses=losses or [1.0] * 30, sigs=sigs))


def test_stale_reader():
    r = L.stale_grads(_view({"stale_steps": 15, "stale_checked": 16}))
    assert r.state == "present" and "15 of 16" in r.note
    assert L.stale_grads(_view({"stale_steps": 0, "stale_checked": 16})).state == "absent"
    assert L.stale_grads(_view({})).state is None


def test_params_readers_name_the_first_layer():
    r = L.orphan_params(_view({"orphan_params": 2, "orphan_layer": "0", "loop_checked": 8}))
    assert r.state == "present" and "`0`" in r.note and r.note.startswith("2 parameters")
    assert L.orphan_params(_view({"orphan_params": 0, "loop_checked": 8})).state == "absent"
    r = L.detached(_view({"detached_params": 2, "detached_layer": "features.0", "loop_checked": 8}))
    assert r.state == "present" and "`features.0`" in r.note
    # nothing examined: unobserved, whatever the count says
    assert L.detached(_view({"detached_params": 0})).state is None
    assert L.orphan_params(_view({"orphan_params": 3, "loop_checked": 0})).state is None


def test_loss_input_reader_uses_the_floor_of_k():
    k = 3
    floor = L.softmax_floor(k)
    above = [1.0] * 20 + [floor * 1.01] * 10
    below = [1.0] * 20 + [floor * 0.9] * 10  # NLL on the log of the probabilities goes below it
    probs = {"output_probabilities": 1.0, "out_features": k}
    assert L.loss_input(_view(probs, above)).state == "probabilities"
    r = L.loss_input(_view(probs, below))
    assert r.state == "logits" and "does not take them as logits" in r.note
    # under the PROB_SHARE cut: logits, whatever the loss
    assert L.loss_input(_view({"output_probabilities": 0.85, "out_features": k}, above)).state == "logits"
    assert L.loss_input(_view({"out_features": k})).state is None
    # no K: the floor cannot be read, the rows alone decide
    assert L.loss_input(_view({"output_probabilities": 1.0}, below)).state == "probabilities"


@pytest.mark.parametrize("sigs,state", [
    ({"stale_steps": 15, "stale_checked": 16}, "stale_gradients"),
    ({"orphan_params": 2, "orphan_layer": "0", "loop_checked": 8}, "params_not_in_optimizer"),
    ({"detached_params": 2, "detached_layer": "0", "loop_checked": 8}, "graph_detached"),
])
def test_each_reading_makes_its_state_the_top_hypothesis(sigs, state):
    # a run that learns (the loss falls far below chance): the loop signature alone decides
    losses = [math.log(3)] * 5 + [0.1] * 25
    quiet = {"stale_steps": 0, "stale_checked": 16, "orphan_params": 0, "detached_params": 0, "loop_checked": 8,
             "output_probabilities": 0.0, "out_features": 3}
    trace = make_trace(losses=losses, sigs={**quiet, **sigs})
    post = api.posterior(trace)
    hyps = api.hypotheses(trace)
    assert hyps and (hyps[0].cause, hyps[0].state) == ("training_loop", state)
    assert post["training_loop"][state] >= 0.5 and not post.is_healthy
    healthy = api.posterior(make_trace(losses=losses, sigs=quiet))
    assert healthy.is_healthy and max(p for s, p in healthy["training_loop"].items() if s != "ok") < 0.05
