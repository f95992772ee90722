"""The input-scale measurement: pure functions on hand-computed tensors, then the entry layers a
monitor finds and measures, and a tiny run where only the new signature decides."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal import api
from neuraldbg.causal.nodes.data import (INPUT_FEATURES, INPUT_NORMALIZED_AT, INPUT_OFF_SCALE, INPUT_RMS_FIRST,
                                         INPUT_RMS_LARGE, INPUT_RMS_MAX, input_scale_state)
from neuraldbg.monitor.measurements.input_scale import (EVERY_CHECK, FIRST_CHECKS, InputScale, check_due,
                                                        feature_abs_max, feature_dim, feature_rms, is_norm, off_scale,
                                                        running_max)


# ---- pure functions -------------------------------------------------------------------------

def test_feature_rms_per_column():
    x = torch.tensor([[3.0, 0.0], [4.0, 2.0]])
    # column 0: sqrt((9 + 16) / 2); column 1: sqrt(4 / 2)
    assert torch.allclose(feature_rms(x, 1), torch.tensor([math.sqrt(12.5), math.sqrt(2.0)]))


def test_feature_rms_per_channel_of_an_image_batch():
    x = torch.zeros(2, 3, 2, 2)
    x[:, 1] = 255.0
    x[0, 2, 0, 0] = 8.0  # one of 8 entries of channel 2
    assert torch.allclose(feature_rms(x, 1), torch.tensor([0.0, 255.0, math.sqrt(64 / 8)]))
    assert torch.equal(feature_abs_max(x, 1), torch.tensor([0.0, 255.0, 8.0]))


def test_feature_dim_follows_the_layer():
    assert feature_dim(nn.Linear(4, 2), torch.zeros(5, 7, 4)) == 2
    conv = nn.Conv2d(3, 4, 3)
    assert feature_dim(conv, torch.zeros(5, 3, 8, 8)) == 1
    assert feature_dim(conv, torch.zeros(3, 8, 8)) == 0  # unbatched
    assert feature_dim(nn.LSTM(4, 8, batch_first=True), torch.zeros(2, 9, 4)) == 2


def test_running_max_keeps_finite_maxima():
    a = running_max(None, torch.tensor([1.0, float("nan"), 3.0]))
    assert torch.equal(a, torch.tensor([1.0, 0.0, 3.0]))
    b = running_max(a, torch.tensor([2.0, 5.0, float("inf")]))
    assert torch.equal(b, torch.tensor([2.0, 5.0, 3.0]))
    assert torch.equal(running_max(b, torch.tensor([7.0])), torch.tensor([7.0]))  # another width: starts over


def test_off_scale_names_the_features_above_the_cut_largest_first():
    assert off_scale([1.0, 40.0, float("nan"), 300.0, 29.9], cut=30.0) == [3, 1]
    assert off_scale([1.0, 2.0]) == []


def test_input_scale_state_cut():
    assert input_scale_state(None) is None
    assert input_scale_state(INPUT_RMS_LARGE * 0.99) == "normal"
    assert input_scale_state(INPUT_RMS_LARGE * 1.01) == "large"


def test_norm_layers_by_class_and_library_name():
    class T5LayerNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))

    assert is_norm(nn.LayerNorm(4)) and is_norm(nn.BatchNorm1d(4)) and is_norm(T5LayerNorm())
    assert not is_norm(nn.Linear(4, 4))


# ---- the measurement in a monitor -------------------------------------------------------------

def _part(dbg) -> InputScale:
    parts = dbg._parts.of_type(InputScale)
    return parts[0] if isinstance(parts, list) else parts


def _steps(model, x, steps=3, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt, **kw) as dbg:
        for s in range(steps):
            dbg.step = s
            loss = model(x).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


def test_only_the_layer_reading_the_input_is_measured_through_a_flatten_view():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(16, 3, 2, 2)
    x[:, 1] *= 500.0
    dbg = _steps(model, x)
    part = _part(dbg)
    assert sorted(part._rms) == ["1"]  # the hidden Linear "3" reads an activation, not the input
    sig = dict(dbg.trace().signatures.items())
    assert sig[INPUT_FEATURES.name] == 12
    assert sig[INPUT_RMS_MAX.name] > 100
    assert sig[INPUT_OFF_SCALE.name].startswith("4 of 12 features: 1[")  # channel 1 = flattened 4..7
    assert all(f"1[{i}]" in sig[INPUT_OFF_SCALE.name] for i in (4, 5, 6, 7))
    assert not part._handles and not part._cand  # every hook removed on exit


def test_a_normalization_layer_as_entry_is_noted_not_measured():
    model = nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 2))
    dbg = _steps(model, 300.0 * torch.randn(8, 6))
    sig = dict(dbg.trace().signatures.items())
    assert INPUT_RMS_MAX.name not in sig and sig[INPUT_NORMALIZED_AT.name] == "0"
    ev = api.evidence(dbg.trace())
    assert "input_scale" not in ev.observed and "normalized first" in ev.unobserved["input_scale"]


def test_token_ids_give_no_reading_and_no_gap():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        dbg.step = 0
        loss = model(torch.randint(0, 10, (4, 3))).pow(2).mean()
        loss.backward()
        dbg.record_loss(loss)
        opt.step()
    t = dbg.trace()
    assert t.signatures.gap(INPUT_RMS_MAX) is None
    assert "input_scale" not in api.evidence(t).observed


def test_sub_networks_called_directly_are_the_entry():
    """A loop that calls the root's children itself (a GAN, a Lightning module's model): their
    inputs are the model's."""
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3))

    model = Pair()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for s in range(2):
            dbg.step = s
            loss = model.g(100.0 * torch.ones(5, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert sorted(_part(dbg)._rms) == ["g.0"]
    assert dict(dbg.trace().signatures.items())[INPUT_RMS_MAX.name] == pytest.approx(100.0)


def test_a_hidden_activation_at_a_freed_input_address_is_not_an_entry():
    """Regression: the entry layers were found by storage address alone, and an input freed after
    its call left its address to the allocator: a hidden activation allocated there made its
    layer an entry layer on some runs and not others (a GAN's input scale read 17 or 529 features
    from one seed)."""
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Tanh()  # no weight matrix: never an entry layer itself
            self.b = nn.Sequential(nn.Tanh(), nn.Linear(64, 64))  # b.1 reads a hidden activation

    model = Pair()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for s in range(4):
            dbg.step = s
            h = model.a(1000.0 * torch.randn(32, 64))  # the input is freed when the call returns
            loss = model.b(h).pow(2).mean()  # b.0's output: a new tensor of the freed input's size
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert _part(dbg)._rms == {}


def test_unchecked_steps_measure_nothing():
    model = nn.Sequential(nn.Linear(3, 2))
    x = torch.ones(4, 3)
    dbg = _steps(model, x, steps=1, every=2)  # step 0 is checked
    assert _part(dbg)._at == 0
    dbg = _steps(model, 1000 * x, steps=3, every=2)
    # steps 0 and 2 checked, both at 1000
    assert dict(dbg.trace().signatures.items())[INPUT_RMS_MAX.name] == pytest.approx(1000.0)


def _scaled_run(scales, every=1) -> dict:
    """The signatures of a run whose inputs are ones times each step's scale."""
    model = nn.Sequential(nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt, every=every) as dbg:
        for s, scale in enumerate(scales):
            dbg.step = s
            loss = model(scale * torch.ones(4, 2)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dict(dbg.trace().signatures.items())


def test_the_first_step_is_kept_apart_from_the_running_maximum():
    sig = _scaled_run((1.0, 1.0, 500.0))  # a column in other units from step 2 on
    assert sig[INPUT_RMS_FIRST.name] == pytest.approx(1.0) and sig[INPUT_RMS_MAX.name] == pytest.approx(500.0)


def test_check_due_reads_the_first_checks_then_one_in_every_check():
    assert (FIRST_CHECKS, EVERY_CHECK) == (16, 8)  # the cut points the cases are computed for
    due = [n for n in range(48) if check_due(n)]
    assert due == list(range(16)) + [23, 31, 39, 47]


def test_after_the_first_checks_the_scale_is_read_one_check_in_every_check(monkeypatch):
    """Past the first checks the per-feature reductions run on one check in EVERY_CHECK, and a
    column that goes off-scale there is still read within that many checks."""
    import neuraldbg.monitor.measurements.input_scale as IS

    calls = []
    real = IS.feature_rms
    monkeypatch.setattr(IS, "feature_rms", lambda x, d: calls.append(1) or real(x, d))
    def rms_max(scales, every=1):
        return _scaled_run(scales, every)[INPUT_RMS_MAX.name]

    n = 1 + FIRST_CHECKS + 3 * EVERY_CHECK  # the step that finds the entry layer, then the schedule
    assert rms_max([1.0] * n) == pytest.approx(1.0)
    assert len(calls) == 1 + FIRST_CHECKS + 3
    # off-scale from a step the schedule skips: read at the next due check
    skipped = 1 + FIRST_CHECKS + 1
    assert rms_max([1.0] * skipped + [500.0] * EVERY_CHECK) == pytest.approx(500.0)
    assert rms_max([1.0] * skipped + [500.0] * (EVERY_CHECK - 3) + [1.0] * 3) == pytest.approx(1.0)
    # the schedule counts checked steps, not steps
    assert rms_max([1.0] * (2 * skipped) + [500.0] * (2 * EVERY_CHECK), every=2) == pytest.approx(500.0)


# ---- end to end: only the input's scale decides --------------------------------------------------

def _train(scale: float, seed: int, steps: int = 100):
    """A 3-class MLP on 8 z-scored features, feature 5 multiplied by ``scale`` from step 0."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
    x[:, 5] *= scale
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for s in range(steps):
            dbg.step = s
            i = torch.randint(0, 1024, (64,), generator=g)
            loss = F.cross_entropy(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


@pytest.mark.parametrize("seed", (0, 1))
def test_a_feature_off_scale_from_step_0_reads_data_shifted_naming_it(seed):
    hyps = _train(255.0, seed).get_causal_hypotheses()
    assert hyps and (hyps[0].cause, hyps[0].state) == ("data", "shifted")
    assert "0[5]" in hyps[0].description


@pytest.mark.parametrize("seed", (0, 1))
def test_the_healthy_twin_stays_quiet(seed):
    dbg = _train(1.0, seed)
    assert api.evidence(dbg.trace()).observed["input_scale"] == "normal"
    assert dbg.get_causal_hypotheses() == []


def test_a_failing_statistic_never_raises_into_training(monkeypatch):
    import neuraldbg.monitor.measurements.input_scale as M

    def boom(x, dim):
        raise RuntimeError("boom")

    monkeypatch.setattr(M, "feature_rms", boom)
    model = nn.Sequential(nn.Linear(3, 2))
    dbg = _steps(model, torch.ones(4, 3))  # trains through
    part = _part(dbg)
    assert not part._handles and not part._cand and not part._rms


def test_a_bare_linear_root_is_its_own_entry():
    dbg = _steps(nn.Linear(3, 2), 50.0 * torch.ones(4, 3))
    assert sorted(_part(dbg)._rms) == ["Linear"]
    assert dict(dbg.trace().signatures.items())[INPUT_RMS_MAX.name] == pytest.approx(50.0)
