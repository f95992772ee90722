"""``dbg.settings``: the monitor's arguments as one frozen record that rebuilds a monitor."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from neuraldbg import DetectorConfig, NeuralDbg
from neuraldbg.monitor.settings import Settings


def test_settings_hold_every_argument_validated_and_rebuild_the_monitor(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = NeuralDbg(model, "cnn", opt, 3, config={"explode_abs": 20.0}, detectors=["gradient"], sync_every=4,
                    reference=lambda m: torch.tensor(1.0), reference_every=5)
    s = dbg.settings
    assert isinstance(s, Settings) and s.family == "cnn" and s.optimizer is opt and s.every == 3
    assert s.config == DetectorConfig(explode_abs=20.0) and s.detectors == ("gradient",) and s.sync_every == 4
    assert s.reference_every == 5 and s.snapshots is None and s.autosave is None
    again = NeuralDbg(model, **s.as_kwargs())
    assert again.settings == s
    assert dbg.family == "cnn" and dbg.every == 3 and dbg.config is s.config  # read from the settings
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.every = 1  # type: ignore[misc]
    assert s.replace(snapshots=True).snapshots is True and s.snapshots is None


@pytest.mark.parametrize("kw,err,match", [
    ({"every": 0}, ValueError, "every must be an int >= 1"),
    ({"sync_every": 0}, ValueError, "sync_every must be an int >= 1"),
    ({"config": 3}, TypeError, "config must be a DetectorConfig or dict"),
    ({"detectors": "gradient"}, TypeError, "a list of detector names"),
    ({"scaler": object()}, TypeError, "torch.amp.GradScaler"),
    ({"at_init": 1}, TypeError, "at_init must be True, False, None .* or a string"),
    ({"at_init": "  "}, ValueError, "says why the weights are not at initialization"),
])
def test_bad_arguments_name_what_is_valid(kw, err, match):
    with pytest.raises(err, match=match):
        NeuralDbg(torch.nn.Linear(2, 2), **kw)
