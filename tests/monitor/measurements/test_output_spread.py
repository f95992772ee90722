"""The output's spread across the batch: pure functions on hand-computed tensors, and the
measurement on tiny runs (``neuraldbg/monitor/measurements/output_spread.py``)."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal.nodes.output import OUTPUT_CV, OUTPUT_SPREAD_DROP, OUTPUT_WINDOW
from neuraldbg.monitor.measurements import output_spread as S


def test_spread_and_rms_by_hand():
    y = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    spread, rms = S.spread_and_rms(y).tolist()
    assert spread == pytest.approx(1.0)                  # std over the batch: 1 in each column
    assert rms == pytest.approx(math.sqrt(7.5))          # (1 + 4 + 9 + 16) / 4
    const = torch.arange(3 * 5000, dtype=torch.float32).reshape(1, -1).expand(4, -1)  # same row 4x
    assert S.spread_and_rms(const).tolist()[0] == 0.0     # subsampled columns: still constant
    assert S.spread_and_rms(torch.ones(4, 3, 7000, dtype=torch.bfloat16)).dtype == torch.float32


def test_spread_summary_by_hand():
    first = [(1.0, 2.0)] * 3
    last = [(0.01, 1.0), (0.02, 1.0), (0.03, 1.0)]
    cv, drop = S.spread_summary(first, last)
    assert cv == pytest.approx(0.02) and drop == pytest.approx(0.02)
    assert S.spread_summary(first, [(float("nan"), 1.0)]) is None
    assert S.spread_summary(first, [(0.0, 0.0)]) is None          # an all-zero output
    assert S.spread_summary([(0.0, 1.0)], [(0.0, 1.0)]) == (0.0, 1.0)   # constant throughout: no drop
    assert S.spread_summary([(0.0, 1.0)], [(1.0, 1.0)])[1] > 1e3       # grew from nothing


def _run(kind, steps=60, every=1, seed=0):
    """A small MLP on 4 classes of a linear teacher: ``"healthy"`` (cross-entropy), ``"regression"``
    (a one-output head on ids, correct shapes) or ``"broadcast"`` (the same with (B,) targets
    against (B, 1) predictions: broadcast to (B, B), only their mean can be learned)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(8, 4, generator=g)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4 if kind == "healthy" else 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with NeuralDbg(model, every=every) as dbg:
        for _ in range(steps):
            x = torch.randn(64, 8, generator=g)
            y = (x @ teacher).argmax(1)
            out = model(x)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch's broadcast warning
                if kind == "healthy":
                    loss = F.cross_entropy(out, y)
                elif kind == "regression":
                    loss = F.mse_loss(out.squeeze(1), y.float())
                else:
                    loss = F.mse_loss(out, y.float())
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            with torch.no_grad():
                model(torch.zeros(2, 8))  # an evaluation forward: not the training output
    return dbg


def test_a_loss_met_only_by_a_constant_collapses_the_output():
    sigs = _run("broadcast").signatures()
    assert sigs.number(OUTPUT_CV) < 0.05 and sigs.number(OUTPUT_SPREAD_DROP) < 0.3


@pytest.mark.parametrize("kind", ["healthy", "regression"])
def test_a_learned_output_varies(kind):
    sigs = _run(kind).signatures()
    assert sigs.number(OUTPUT_CV) > 0.3 and sigs.number(OUTPUT_SPREAD_DROP) > 1.0


def test_too_few_checked_steps_is_a_gap_with_a_reason():
    sigs = _run("healthy", steps=2 * OUTPUT_WINDOW * 10 - 20, every=10).signatures()
    assert sigs.number(OUTPUT_CV) is None
    assert "fewer than" in sigs.gap(OUTPUT_CV)


def test_the_hook_runs_on_checked_steps_only(monkeypatch):
    calls = []
    orig = S.spread_columns
    monkeypatch.setattr(S, "spread_columns", lambda y: calls.append(1) or orig(y))
    _run("healthy", steps=40, every=10)
    assert len(calls) == 4


@pytest.mark.parametrize("kind", ["healthy", "broadcast"])
def test_readings_reduced_later_are_the_readings_reduced_at_once(monkeypatch, kind):
    """A small output is copied in the hook and reduced when the transfer reads its step: the
    same kernels on the same values, so the signatures are those of a reduction in the hook."""
    later = _run(kind, steps=60).signatures()
    reduced = []
    orig = S.spread_of
    monkeypatch.setattr(S, "spread_of", lambda f: reduced.append(1) or orig(f))
    monkeypatch.setattr(S, "DEFER_ENTRIES", 0)  # every reading reduced in its hook
    at_once = _run(kind, steps=60).signatures()
    assert reduced  # the hook did reduce
    for sig in (OUTPUT_CV, OUTPUT_SPREAD_DROP):
        assert later.number(sig) == at_once.number(sig) and later.number(sig) is not None


def test_copied_readings_wait_for_a_bounded_number_of_steps(monkeypatch):
    monkeypatch.setattr(S, "MAX_WAITING", 3)
    seen = []
    orig = S.OutputSpread._reduce_waiting
    monkeypatch.setattr(S.OutputSpread, "_reduce_waiting", lambda self: seen.append(len(self._waiting)) or orig(self))
    _run("healthy", steps=60, every=1)
    assert max(seen) <= 3


def test_a_batch_of_one_is_a_gap_that_says_so():
    model = nn.Sequential(nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model) as dbg:
        for _ in range(20):
            loss = model(torch.randn(1, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    sigs = dbg.signatures()
    assert sigs.number(OUTPUT_CV) is None and "batch of one" in sigs.gap(OUTPUT_CV)
