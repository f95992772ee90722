"""Preconditions of root states (``PRECONDITIONS`` of neuraldbg/causal/nodes/): a state the run
lacks what it needs for has probability 0, whatever else the run shows."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal import api
from neuraldbg.causal.nodes import preconditions
from neuraldbg.causal.nodes.loop import NOT_CROSS_ENTROPY, lacks_class_output
from neuraldbg.causal.structure import Precondition
from neuraldbg.causal.view import TraceView
from neuraldbg.trace import Signatures
from scenarios import SCENARIOS, trace


def _view(values=None, gaps=None):
    tr = trace((), sigs=values)
    return TraceView(dataclasses.replace(tr, signatures=Signatures(dict(tr.signatures.items()), {}, dict(gaps or {}))))


def test_a_softmax_before_the_loss_needs_a_cross_entropy_over_classes():
    assert lacks_class_output(_view({"out_features": 4})) is None
    assert lacks_class_output(_view({"out_features": 1})) == "the model's output has 1 unit"
    assert lacks_class_output(_view(gaps={"out_features": NOT_CROSS_ENTROPY})) == "the loss is not a cross-entropy"
    assert lacks_class_output(_view()) is None  # unknown: never rules the state out


def test_corrupted_data_needs_a_non_finite_value_or_faulty_targets():
    healthy = api.impossible(SCENARIOS["healthy"][0]())
    assert ("data", "corrupted") in healthy
    assert ("data", "corrupted") not in api.impossible(SCENARIOS["nan_batch"][0]())


def test_a_precondition_names_an_abnormal_state():
    with pytest.raises(ValueError, match="abnormal root state"):
        Precondition("data", "ok", "x", lambda v: None)
    assert {(p.cause, p.state) for p in preconditions()} >= {("data", "corrupted"),
                                                               ("training_loop", "loss_on_probabilities")}


def _train(model, loss_fn, target, steps=60, lr=1e-3):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(8, 4, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            x = torch.randn(64, 8, generator=gen)
            loss = loss_fn(model(x), target(x, teacher))
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


def test_a_slow_regression_head_is_never_a_softmax_before_the_loss():
    """Regression: a one-output regression MLP that learned slowly was read as
    ``training_loop/loss_on_probabilities`` (p = 0.61-0.72), a state that needs a multi-class
    output and a cross-entropy."""
    dbg = _train(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)), F.mse_loss,
                 lambda x, t: x @ t[:, :1])
    post = dbg.posterior()
    assert post["training_loop"]["loss_on_probabilities"] == 0.0
    assert post["data"]["corrupted"] == 0.0  # nothing non-finite, targets normal
    assert ("training_loop", "loss_on_probabilities") in post.ruled_out


def test_a_softmax_before_cross_entropy_is_still_found():
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4), nn.Softmax(dim=1))
    dbg = _train(model, F.cross_entropy, lambda x, t: (x @ t).argmax(1), lr=0.05)
    top = dbg.get_causal_hypotheses()[0]
    assert (top.cause, top.state) == ("training_loop", "loss_on_probabilities")
    assert not dbg.posterior().ruled_out.get(("training_loop", "loss_on_probabilities"))
