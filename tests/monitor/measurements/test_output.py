"""The output size: the last linear layer in forward order."""
from __future__ import annotations

from torch import nn

from neuraldbg.monitor.measurements import output as G


def test_last_out_features_is_the_output_size():
    mods = {"fc1": nn.Linear(4, 8), "act": nn.ReLU(), "head": nn.Linear(8, 5), "norm": nn.LayerNorm(5)}
    assert G.last_out_features(["fc1", "act", "head", "norm"], mods) == 5
    assert G.last_out_features(["act"], mods) is None
