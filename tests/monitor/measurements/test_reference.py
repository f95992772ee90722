"""The reference-loss add-on: when it is called, what it records, and that training never notices."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, load_session
from neuraldbg.monitor.measurements.reference import evaluate
from tests.tiny import batches, run


def _model() -> nn.Module:
    # dropout draws from the RNG and batch norm updates running statistics in train mode:
    # a reference forward that did either would change the training that follows
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def _train(reference=None, steps: int = 12, set_step: bool = True, **kw):
    """A seeded run; returns (model, losses, dbg)."""
    torch.manual_seed(0)
    r = run(_model(), steps=steps, lr=0.1, data=batches(steps, n=32, seed=1), set_step=set_step,
            monitor={"optimizer": True, "reference": reference, **kw})
    return r.model, [x.item() for x in r.losses], r.dbg


XA, YA = torch.randn(64, 8, generator=torch.Generator().manual_seed(5)), torch.randint(0, 3, (64,))


def held_out(model):
    return F.cross_entropy(model(XA), YA)


def test_training_is_bitwise_identical_with_a_reference():
    bare, bare_losses, _ = _train(None)
    ref, ref_losses, dbg = _train(held_out, reference_every=2)
    assert ref_losses == bare_losses
    for a, b in zip(bare.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)  # weights and batch-norm running statistics alike
    assert all(m.training for m in ref.modules())  # train mode put back after every call
    assert [s for s, _ in dbg.reference_points()] == [0, 2, 4, 6, 8, 10]  # on entry, then every 2nd step


def _stats(seen):
    # NaN marks a missing statistic: compare it as a value
    return [(s.step, s.names, {k: np.nan_to_num(v, nan=-1.0).tolist() for k, v in s.cols.items()}) for s in seen]


def test_the_reference_forward_is_not_in_the_statistics(seen):
    _train(None, steps=6)
    bare = _stats(seen)
    seen.clear()
    _train(held_out, steps=6, reference_every=1)
    assert _stats(seen) == bare


@pytest.mark.parametrize("set_step", [True, False])
def test_records_on_entry_and_every_nth_step(set_step):
    calls = []

    def fn(model):
        calls.append(1)
        return torch.tensor(float(len(calls)))

    _, _, dbg = _train(fn, steps=10, set_step=set_step, reference_every=4)
    pts = dbg.reference_points()
    assert [s for s, _ in pts] == [0, 4, 8]
    assert [v for _, v in pts] == [1.0, 2.0, 3.0]  # the entry value is step 0's, measured once


def test_signatures_first_tail_and_count():
    vals = iter([1.0, 1.2, 1.4, 2.0, 2.2, 2.1, 2.4, 2.3])
    _, _, dbg = _train(lambda m: next(vals), steps=8, reference_every=1)
    sigs = dbg.trace().signatures.as_dict()
    assert sigs["reference_first"] == 1.0
    assert sigs["reference_tail"] == 2.4  # median of the last quarter (2.4, 2.3)
    assert sigs["reference_n"] == 8 and sigs["reference_nonfinite"] == 0


def test_a_nonfinite_tail_is_not_read():
    vals = iter([1.0, 1.1, 1.2, float("nan")])
    _, _, dbg = _train(lambda m: next(vals), steps=4, reference_every=1)
    sigs = dbg.trace().signatures.as_dict()
    assert "reference_tail" not in sigs and sigs["reference_nonfinite"] == 1


def test_a_raising_reference_is_reported_once_and_training_goes_on(caplog):
    def broken(model):
        raise RuntimeError("no held-out data")

    bare, bare_losses, _ = _train(None)
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        model, losses, dbg = _train(broken, reference_every=1)
    assert losses == bare_losses
    assert sum("reference function raised" in r.getMessage() for r in caplog.records) == 1
    assert dbg.reference_points() == [] and "reference_first" not in dbg.trace().signatures.as_dict()


@pytest.mark.parametrize("kw,err", [({"reference": 3.0}, TypeError),
                                    ({"reference": held_out, "reference_every": 0}, ValueError),
                                    ({"reference": held_out, "reference_every": True}, ValueError)])
def test_bad_arguments_name_what_is_valid(kw, err):
    with pytest.raises(err, match="reference"):
        NeuralDbg(_model(), **kw)


def test_evaluate_restores_modes_and_rng():
    model = _model()
    model[3].eval()  # a module the user keeps in eval mode stays so
    state = torch.get_rng_state()
    value = evaluate(lambda m: m(XA).sum() * 0 + (0.0 if m.training else 1.0), model)
    assert float(value) == 1.0  # called in eval mode
    assert torch.equal(torch.get_rng_state(), state)
    assert [m.training for m in model.modules()] == [True, True, True, True, False, True]


def test_session_round_trip_keeps_retention(tmp_path):
    vals = iter([1.0, 1.0, 2.0, 2.5, 2.6, 2.6])
    _, _, dbg = _train(lambda m: next(vals), steps=6, reference_every=1)
    path = dbg.export_aquarium_package(tmp_path / "s.json")
    offline = load_session(path)
    assert offline.trace().signatures.as_dict()["reference_tail"] == dbg.trace().signatures.as_dict()["reference_tail"]
    assert offline.posterior().evidence["retention"] == dbg.posterior().evidence["retention"] == "lost"



def test_a_reference_that_returns_no_scalar_is_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        _, _, dbg = _train(lambda m: m(XA), steps=4, reference_every=1)  # the logits, not a loss
    assert any("reference(model) must return a loss" in r.getMessage() for r in caplog.records)
    assert dbg.reference_points() == []
