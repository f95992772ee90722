"""The output-collapse node and its effect on ``progress``, on hand-built traces
(``neuraldbg/causal/nodes/output.py``, ``neuraldbg/causal/nodes/loss.py``).

Named ``test_output_nodes.py``: ``tests/monitor/measurements/test_output.py`` is the output
size's, and test modules share one namespace.
"""
from __future__ import annotations

import math

from neuraldbg.causal.nodes import output as O
from neuraldbg.causal.nodes.loss import progress
from neuraldbg.causal.view import TraceView
from tests.tiny import make_trace


def test_collapse_needs_a_small_spread_that_fell():
    assert (O.COLLAPSE_CV, O.COLLAPSE_DROP) == (0.05, 0.3)  # the cut points the cases are computed for
    assert O.collapse_state(0.001, 0.03) == "present"    # a constant learned: spread 0.1 % of the output
    assert O.collapse_state(0.0, 0.0) == "present"       # a width-1 bottleneck gone dead
    assert O.collapse_state(0.049, 0.299) == "present"
    assert O.collapse_state(0.05, 0.03) == "absent"      # at the cut: not under it
    assert O.collapse_state(0.001, 0.3) == "absent"
    assert O.collapse_state(0.01, 1.0) == "absent"       # never varied (a decaying signal): nothing learned
    assert O.collapse_state(0.9, 50.0) == "absent"       # a healthy run


def _view(family="mlp", losses=None, **sigs):
    return TraceView(make_trace(losses=losses or [1.0] * 30, family=family, sigs=sigs))


def test_reader_notes_the_spread_and_leaves_games_and_gaps_unobserved():
    r = O.output_collapse(_view(output_cv=0.002, output_spread_drop=0.04))
    assert r.state == "present" and "no longer depends on its input" in r.note
    assert O.output_collapse(_view(output_cv=0.9, output_spread_drop=40.0)).state == "absent"
    assert O.output_collapse(_view()).state is None
    # a discriminator at equilibrium outputs a constant: no evidence in a game
    assert O.output_collapse(_view("gan", output_cv=0.0, output_spread_drop=0.0)).state is None


def test_progress_is_unobserved_for_a_collapsed_output_without_chance_level():
    """Against its own start, a regression that learned only its targets' mean reads "learning"
    (its loss fell from the start to their variance); that fall is the constant being learned."""
    curve = [4.0] * 3 + [1.2] * 27
    assert progress(_view(losses=curve)).state == "learning"
    r = progress(_view(losses=curve, output_cv=0.001, output_spread_drop=0.02))
    assert r.state is None and "collapsed" in r.reason
    # with a chance level the loss is read against it, collapsed or not
    k = 4
    at_chance = [math.log(k)] * 30
    assert progress(_view(losses=at_chance, out_features=k, output_cv=0.0, output_spread_drop=0.0)).state == "stalled"
