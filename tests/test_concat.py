"""Two consecutive parts of one run (a resume from a checkpoint) read as one trace:
``neuraldbg.distributed.concat_traces`` on hand-built traces, and ``NeuralDbg(resume=...)``."""
from __future__ import annotations

import dataclasses

import pytest

from neuraldbg import NeuralDbg
from neuraldbg.distributed import concat_traces
from neuraldbg.events.base import GRADIENT, OPTIMIZER, make_event
from neuraldbg.schema import SessionFormatError
from neuraldbg.session import trace_to_dict
from tiny import make_trace, mlp, run


def part(trace, first):
    """``trace`` moved to start at step ``first`` (its loss history with it)."""
    bad = trace.loss.first_nonfinite_step
    loss = dataclasses.replace(trace.loss, history=tuple((s + first, v) for s, v in trace.loss.history),
                               first_nonfinite_step=None if bad is None else bad + first)
    return dataclasses.replace(trace, first_step=first, last_step=trace.last_step + first, loss=loss)


def test_concat_traces_joins_two_consecutive_parts():
    earlier = make_trace([make_event(GRADIENT, "vanishing", "fc", 3, 1.0, {})], losses=[2.0, 1.5, 1.0, 0.5],
                         sigs={"init_scale_log10": 0.1, "init_scale_n": 2, "stats_steps": 4, "grad_steps": 4,
                               "step_ratio_median": 0.001, "step_ratio_max": 0.002, "step_ratio_steps": 4,
                               "lr_peak": 0.05, "lr": [0.05], "stale_checked": 4},
                         internal_errors=1)
    later = part(make_trace([make_event(OPTIMIZER, "spike", None, 1, 1.0, {})], losses=[0.4, float("nan"), 9.0],
                            sigs={"started_trained": "resumed from a checkpoint at step 4", "stats_steps": 3,
                                  "grad_steps": 3, "step_ratio_median": 0.5, "step_ratio_max": 0.9,
                                  "step_ratio_steps": 3, "lr_peak": 5.0, "lr": [5.0], "stale_checked": 3}), 4)
    later = dataclasses.replace(later, events=tuple(dataclasses.replace(e, step=5, end_step=5) for e in later.events),
                                signatures=later.signatures.updated({}, gaps={"init_scale_log10": "not at init"}))
    tr = concat_traces(earlier, later)
    assert (tr.first_step, tr.last_step) == (0, 6)
    assert [(e.kind, e.step) for e in tr.events] == [("vanishing", 3), ("spike", 5)]
    assert (tr.loss.n, tr.loss.first, tr.loss.last, tr.loss.min) == (7, 2.0, 9.0, 0.4)
    assert tr.loss.n_nonfinite == 1 and tr.loss.first_nonfinite_step == 5
    assert [s for s, _ in tr.loss.history] == list(range(7))
    sig = tr.signatures.as_dict()
    # entry: the earlier part's (it started at initialization; the resume does not erase that)
    assert sig["init_scale_log10"] == 0.1 and "started_trained" not in sig
    assert "init_scale_log10" not in tr.signatures.gaps()
    # run counts add up, the latest state is the later part's, the peak is the larger
    assert (sig["stats_steps"], sig["grad_steps"], sig["lr"], sig["lr_peak"]) == (7, 7, (5.0,), 5.0)
    # the step sizes are read at the peak learning rate: the later part's, which ran at it
    assert (sig["step_ratio_median"], sig["step_ratio_steps"]) == (0.5, 3)
    # other window signatures: the earlier part's window of first steps
    assert sig["stale_checked"] == 4
    assert tr.internal_errors == 1


def test_concat_traces_keeps_the_earlier_window_when_the_learning_rate_did_not_rise():
    earlier = make_trace(losses=[1.0, 0.5], sigs={"step_ratio_median": 0.001, "lr_peak": 0.05})
    later = part(make_trace(losses=[0.4], sigs={"step_ratio_median": 0.0005, "lr_peak": 0.05}), 2)
    assert concat_traces(earlier, later).signatures.as_dict()["step_ratio_median"] == 0.001


def test_concat_traces_rejects_parts_that_are_not_consecutive():
    earlier = make_trace(losses=[1.0] * 10)
    with pytest.raises(ValueError, match="not consecutive"):
        concat_traces(earlier, part(make_trace(losses=[1.0]), 3))
    with pytest.raises(ValueError, match="different families"):
        concat_traces(earlier, part(make_trace(losses=[1.0], family="cnn"), 10))
    with pytest.raises(TypeError, match="must be a Trace"):
        concat_traces(earlier, {"steps": {}})


def test_a_resumed_monitor_answers_for_the_whole_run():
    model = mlp()
    first = run(model, steps=20, monitor={"optimizer": True}, set_step=True)
    doc = first.dbg.session_dict()
    assert doc["priors"] is None and doc["loss"]["n"] == 20
    dbg = NeuralDbg(model, at_init="resumed from a checkpoint at step 20", resume=doc)
    with dbg:
        assert dbg.trace().loss.n == 20  # nothing of this part yet: the earlier part alone
        for step in range(20, 30):
            dbg.step = step
            dbg.record_loss(1.0)
    tr = dbg.trace()
    assert (tr.first_step, tr.last_step, tr.loss.n) == (0, 29, 30)
    assert dbg.coverage()["init_scale"].observed
    assert dbg.settings.at_init == "resumed from a checkpoint at step 20"
    assert dbg.session_dict()["loss"]["n"] == 30  # a chain of resumes carries it on


def test_resume_rejects_what_is_not_an_earlier_part():
    model = mlp()
    with pytest.raises(TypeError, match="resume must be None, a Trace, a session document"):
        NeuralDbg(model, resume=42)
    with pytest.raises(SessionFormatError, match="resume"):
        NeuralDbg(model, resume={"schema": "nope"})
    cnn = trace_to_dict(make_trace(losses=[1.0], family="cnn"))
    with pytest.raises(ValueError, match="family 'cnn'"):
        NeuralDbg(model, family="mlp", resume=cnn)


