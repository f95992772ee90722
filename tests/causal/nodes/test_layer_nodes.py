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
