"""Dead units of activations applied as functions (neuraldbg/monitor/measurements/functional.py):
read as zero features at the next weight layer's input."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal import api
from neuraldbg.causal.nodes.layers import FUNCTIONAL_RELU_LAYERS
from neuraldbg.monitor.measurements.functional import FunctionalDeadUnits, dead_input_share


def test_dead_input_share_counts_features_zero_on_the_whole_batch_of_a_non_negative_input():
    x = torch.tensor([[0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 3.0]])
    share, nonneg = dead_input_share(x, channels_first=False)
    assert share.item() == 0.5 and nonneg.item()  # features 0 and 2
    share, nonneg = dead_input_share(x - 1.0, channels_first=False)
    assert share.item() == 0.0 and not nonneg.item()  # negatives: no ReLU behind it
    maps = torch.zeros(2, 4, 3, 3)
    maps[:, 1] = 1.0  # channel 1 alive, channels 0, 2, 3 dead
    assert dead_input_share(maps, channels_first=True)[0].item() == 0.75
    assert dead_input_share(maps.flatten(1), channels_first=False)[0].item() == 0.75


class FunctionalCNN(nn.Module):
    """A CNN written with ``F.relu`` everywhere: no activation module for a hook to see."""

    def __init__(self, first_bias: float = 0.0) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 4)
        with torch.no_grad():
            self.conv1.bias.add_(first_bias)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc(F.relu(self.conv2(x)).flatten(1))


def _run(model: nn.Module, steps: int = 12, zero_border: bool = False):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            x = torch.randn(16, 1, 8, 8)
            if zero_border:  # a dark image border: zero input features, no dead units
                x = x.abs()
                x[..., 0, :] = 0.0
            loss = F.cross_entropy(model(x), (x.mean((1, 2, 3)) > 0).long() * 3)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


def test_a_cnn_with_functional_relus_gets_dead_unit_evidence_from_the_next_layer_input():
    """Regression: with ``F.relu`` everywhere a CNN got "dead: no ReLU module is monitored" and
    no dead-unit evidence at all."""
    healthy = _run(FunctionalCNN())
    assert healthy.trace().signatures.number(FUNCTIONAL_RELU_LAYERS) == 2  # conv2 and fc
    assert api.evidence(healthy.trace()).observed["dead"] == "absent"
    dead = _run(FunctionalCNN(first_bias=-10.0))  # conv1's ReLU never fires
    events = [e for e in dead.trace().events if e.kind == "dead"]
    assert [(e.layer, e.step) for e in events] == [("conv2", 0)]
    ev = api.evidence(dead.trace())
    assert ev.observed["dead"] == "init" and "at the input of conv2" in ev.notes["dead"]


def test_the_data_entry_layer_is_not_read_and_other_models_pay_nothing():
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 16))  # one weight layer: it reads the data
    dbg = _run(nn.Sequential(mlp), zero_border=True)
    assert not [e for e in dbg.trace().events if e.kind == "dead"]
    with_modules = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 4))
    with NeuralDbg(with_modules) as dbg:
        assert dbg.addon(FunctionalDeadUnits) is None
    assert NeuralDbg(FunctionalCNN()).addon(FunctionalDeadUnits) is not None
