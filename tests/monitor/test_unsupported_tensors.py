"""Tensor subclasses the monitor does not read: the run goes on unchanged, and the diagnosis says
what it did not see (``dbg.coverage()``, ``docs/api.md`` "Coverage") instead of reading the
missing statistics as a healthy sign."""
from __future__ import annotations

import logging

import torch
from torch import nn

from neuraldbg.causal.nodes.run import UNSUPPORTED_PARAMS
from tests.tiny import mlp, run, tagged

STEPS = 30


class Opaque(torch.Tensor):
    """An activation type that computes like a plain tensor (results come back plain) but refuses
    ``detach``, which every statistic of a module's output starts with."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.detach:
            raise TypeError("Opaque tensors cannot be detached")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class Wrap(nn.Module):
    """Hands its input on as an :class:`Opaque` tensor."""

    def forward(self, x):
        return x.as_subclass(Opaque)


def losses(model: nn.Module, monitor: bool) -> list[float]:
    r = run(model, steps=STEPS, monitor={"optimizer": True} if monitor else None)
    return [float(x) for x in r.losses], r.dbg


def test_subclass_parameters_are_reported_as_not_observed():
    torch.manual_seed(0)
    plain_losses, _ = losses(tagged(mlp()), False)
    torch.manual_seed(0)
    seen, dbg = losses(tagged(mlp()), True)
    assert seen == plain_losses  # the monitor changes nothing, and does not raise
    cov = dbg.coverage()
    assert cov.internal_errors == 0 and not cov.nothing_observed
    # every variable read from parameters or their gradients: not observed, a gap naming the type
    for var in ("exploding", "vanishing", "detached", "init_scale", "step_size"):
        c = cov[var]
        assert not c.observed and c.gap and "Tagged" in c.reason, (var, c)
    assert "4 parameters are Tagged tensors" in cov["exploding"].reason
    assert "weight matrices are Tagged tensors" in cov["step_size"].reason
    # what the loss shows is still observed: the diagnosis is partial, not empty
    assert cov["loss_pattern"].observed and cov["data_nan"].observed
    # a hypothesis whose evidence was not measured says so
    for h in dbg.get_causal_hypotheses():
        if h.cause == "training_loop" and h.state == "graph_detached":
            assert "Not observed: detached (4 parameters are Tagged tensors" in h.description


def test_subclass_weights_with_plain_biases_name_the_weight_type():
    """Only the weight matrices are a subclass: what needs them (the weights' scale, the step
    size) is not observed, and says why, rather than "the model has no weight matrix"."""
    torch.manual_seed(0)
    _, dbg = losses(tagged(mlp(), ("weight",)), True)
    cov = dbg.coverage()
    for var in ("init_scale", "step_size"):
        assert not cov[var].observed and cov[var].gap and "Tagged" in cov[var].reason, cov[var]
    assert "no weight matrix" not in cov["step_size"].reason
    assert dbg.trace().signatures.number(UNSUPPORTED_PARAMS) == 2  # the two weight matrices


def test_a_plain_model_has_no_unsupported_gap():
    """The control: the same run with plain tensors observes what the subclass run could not."""
    torch.manual_seed(0)
    _, dbg = losses(mlp(), True)
    cov = dbg.coverage()
    assert all(cov[v].observed for v in ("exploding", "vanishing", "init_scale", "step_size")), cov
    assert not any("Tagged" in why for why in cov.unobserved().values())


def test_an_activation_the_statistics_cannot_read_is_an_internal_error_not_a_crash(caplog):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Wrap(), nn.Linear(16, 3))
    plain_losses, _ = losses(model, False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Wrap(), nn.Linear(16, 3))
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        seen, dbg = losses(model, True)
    assert seen == plain_losses
    cov = dbg.coverage()
    assert cov.internal_errors >= 1 and "Opaque tensors cannot be detached" in caplog.text
    assert f"{cov.internal_errors} internal error" in cov.summary()
    assert not cov.nothing_observed  # the other layers were measured
