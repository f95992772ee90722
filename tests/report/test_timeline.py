"""Cutting a stored trace back to a step, and the posterior as of each checked step."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.causal import api
from neuraldbg.examples import build_model
from neuraldbg.report.timeline import checked_steps, posterior_timeline, trace_until


def lr_loop(steps, stop_at=None):
    """A tiny MLP at a 1000x learning rate; returns the monitor's trace at ``stop_at`` (live,
    mid-run) and at the end."""
    torch.manual_seed(0)
    model = build_model("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=50.0, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    mid = None
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            dbg.step = step
            x = torch.randn(32, 16, generator=gen)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), x[:, :4].argmax(1))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            if step == stop_at:
                mid = dbg.trace()
    return mid, dbg.trace()


@pytest.fixture(scope="module")
def traces():
    return lr_loop(60, stop_at=30)


def test_cut_at_the_last_step_is_the_whole_trace(traces):
    _, full = traces
    cut = trace_until(full, full.last_step)
    assert cut.events == full.events and cut.loss == full.loss
    assert api.posterior(cut) == api.posterior(full)


def test_cut_mid_run_sees_what_the_live_monitor_saw(traces):
    """The evidence of the cut equals the evidence of the live monitor's trace at that step
    (the step-size signature, read over the first 16 checked steps, is in both)."""
    mid, full = traces
    cut = trace_until(full, mid.last_step)
    assert cut.last_step == mid.last_step
    assert [s for s, _ in cut.loss.history] == [s for s, _ in mid.loss.history]
    assert [(e.key, e.step) for e in cut.events] == [(e.key, e.step) for e in mid.events]
    assert all(e.end_step <= mid.last_step for e in cut.events)
    assert api.evidence(cut).observed == api.evidence(mid).observed


def test_nothing_from_the_future():
    from neuraldbg.events.base import Event
    from neuraldbg.trace import LayerInfo, LossSummary, Trace

    t = Trace(events=(Event("gradient_health_transition", "exploding", "fc", 5, 14, count=10),),
              layers=(LayerInfo("fc", "Linear", 0, 10),), family="mlp", first_step=0, last_step=19,
              loss=LossSummary(n=20, first=1.0, last=float("nan"), min=1.0, n_nonfinite=5, first_nonfinite_step=15,
                               history=tuple((i, 1.0 if i < 15 else float("nan")) for i in range(20))))
    early = trace_until(t, 3)
    assert early.events == () and early.loss.n == 4 and early.loss.n_nonfinite == 0
    assert early.loss.first_nonfinite_step is None
    mid = trace_until(t, 9)
    (e,) = mid.events
    assert (e.step, e.end_step, e.count) == (5, 9, 5)
    late = trace_until(t, 17)
    assert late.loss.n_nonfinite == 3 and late.loss.first_nonfinite_step == 15


def test_checked_steps_keep_onsets_and_thin_the_rest(traces):
    _, full = traces
    steps = checked_steps(full)
    assert steps == list(range(full.first_step, full.last_step + 1))  # short run: every step
    few = checked_steps(full, max_points=10)
    assert len(few) <= 10 and full.last_step in few
    assert {e.step for e in full.events} <= set(few)
    with pytest.raises(ValueError, match="max_points"):
        checked_steps(full, max_points=1)


def test_timeline_ends_at_the_final_posterior(traces):
    _, full = traces
    points = posterior_timeline(full)
    final = api.posterior(full)
    assert points[-1].p_healthy == pytest.approx(final.p_healthy)
    assert points[-1].probability("learning_rate", "too_high") == pytest.approx(final["learning_rate"]["too_high"])
    assert points[-1].probability("no_such", "state") == 0.0


def test_a_cut_keeps_only_the_signatures_measured_by_then():
    """Regression: a cut at step s kept every signature, so a reference loss measured over the
    whole run read `retention = lost` at step 5 (and raised P(learning_rate too_high) from step 0)."""
    from neuraldbg.trace import LayerInfo
    from tests.tiny import make_trace

    full = make_trace([], (LayerInfo("fc", "Linear", 0, 10),), [2.0 * 0.98 ** i for i in range(60)],
                      sigs={"out_features": 28, "reference_first": 0.94, "reference_tail": 2.4, "reference_n": 16,
                            "init_scale_log10": 0.01, "step_ratio_median": 0.01},
                      sig_steps={"step_ratio_median": 20}, steps=60)
    assert api.evidence(full).observed["retention"] == "lost"
    early = trace_until(full, 5)
    assert "retention" not in api.evidence(early).observed  # the tail is known at the end only
    assert api.evidence(early).observed["init_scale"] == "normal"  # measured on entry: known from step 0
    assert "step_size" not in api.evidence(early).observed  # its window closed at step 20
    assert api.evidence(trace_until(full, 20)).observed["step_size"] == "normal"
    assert api.evidence(trace_until(full, 59)).observed["retention"] == "lost"
