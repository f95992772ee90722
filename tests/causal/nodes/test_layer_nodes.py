"""The layer nodes (neuraldbg/causal/nodes/layers.py): what a model whose activations are all
functions cannot show is the monitor's gap, not the run's."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal import api
from neuraldbg.causal.nodes.layers import FUNCTIONAL_ACTIVATIONS, functional_activations


def test_functional_activations_means_layers_and_no_activation_module():
    assert functional_activations({"Conv2d", "Linear", "MaxPool2d"})
    assert functional_activations({"GCNConv", "Linear"})
    assert not functional_activations({"Linear", "ReLU"})
    assert not functional_activations({"Linear", "GELU"})
    assert not functional_activations({"Linear", "NewGELUActivation"})  # a library's module
    assert not functional_activations(set())


class FunctionalTanh(nn.Module):
    """A model whose activations are all functions, none of them ReLU-like (``torch.tanh``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = F.max_pool2d(torch.tanh(self.conv1(x)), 2)
        return self.fc(torch.tanh(self.conv2(x)).flatten(1))


def _run(model: nn.Module) -> dict:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model) as dbg:
        for _ in range(8):
            x = torch.randn(16, 1, 8, 8)
            loss = F.cross_entropy(model(x), (x.mean((1, 2, 3)) > 0).long() * 3)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return api.evidence(dbg.trace())


def test_dead_units_no_function_can_show_are_a_gap_of_the_monitor():
    """Regression: with the activations all functions, "dead: no ReLU module is monitored" was
    filed under what the run did not show. Where no weight layer receives a non-negative input
    (no ReLU-like function), dead units are a gap of the monitor (a ReLU applied as a function is
    read at the next layer's input: tests/monitor/measurements/test_functional.py)."""
    ev = _run(FunctionalTanh())
    assert "dead" not in ev.observed and ev.gaps["dead"] == FUNCTIONAL_ACTIVATIONS
    # a model with its ReLUs as modules observes the variable
    ev = _run(nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 4)))
    assert ev.observed["dead"] == "absent"


def _saturated_at(layers, layer, step=0):
    from neuraldbg.events.base import ACTIVATION, make_event
    from neuraldbg.trace import LayerInfo
    from tiny import make_trace

    infos = [LayerInfo(name, kind, i, 0) for i, (name, kind) in enumerate(layers)]
    ev = [make_event(ACTIVATION, "saturated", layer, step, 0.9, {"saturated_frac": 0.95})]
    return api.evidence(make_trace(events=ev, layers=infos, losses=[2.0 - 0.01 * i for i in range(40)]))


def test_a_softmax_one_hot_at_init_reads_init_softmax_and_other_bounded_activations_init():
    layers = [("attn.c_attn", "Linear"), ("attn.softmax", "Softmax"), ("mlp.act", "Tanh"), ("head", "Linear")]
    ev = _saturated_at(layers, "attn.softmax")
    assert ev.observed["saturation"] == "init_softmax" and "logits too large" in ev.notes["saturation"]
    assert _saturated_at(layers, "mlp.act").observed["saturation"] == "init"
    assert _saturated_at(layers, "attn.softmax", step=30).observed["saturation"] == "later"


def test_init_softmax_is_far_stronger_evidence_for_weights_too_large_than_plain_init():
    from neuraldbg.causal.cpd import default_cpds
    from neuraldbg.causal.structure import default_network

    net = default_network()
    sat = default_cpds(net)["saturation"]
    states, parents = list(sat.states), list(sat.parents)

    def p(state, **at):  # every parent not named at its first state (ok, absent)
        pos = [net.states_of(q).index(at.get(q, net.states_of(q)[0])) for q in parents]
        return sat.values[(states.index(state), *pos)]

    large, ok = p("init_softmax", initialization="too_large"), p("init_softmax")
    assert large / ok > 100 > p("init", initialization="too_large") / p("init")
