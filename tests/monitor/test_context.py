"""The monitor's parts: their lifecycle, their context, and declared signatures only."""
from __future__ import annotations

import logging

import pytest
import torch

from neuraldbg import NeuralDbg
from neuraldbg.causal.nodes.run import LR_PEAK, OUT_FEATURES
from neuraldbg.lifecycle import HOOKS, AddonContext, Measurement
from neuraldbg.monitor import measurements as M
from neuraldbg.trace import Signature
from tests.tiny import run


class Recorder(Measurement):
    """Records every lifecycle call it gets, with the context's view at that moment."""

    signatures = (LR_PEAK,)
    calls: list = []

    def __init__(self):
        self.calls = []

    def enter(self, ctx):
        assert isinstance(ctx, AddonContext)
        self.calls.append(("enter", ctx.step))

    def step_started(self, ctx, step, checked):
        self.calls.append(("step_started", step, checked))

    def step_closed(self, ctx, step, checked):
        self.calls.append(("step_closed", step, checked))

    def checked_step(self, ctx, stats):
        self.calls.append(("checked_step", stats.step))

    def optimizer_pre(self, ctx, optimizer, checked):
        self.calls.append(("optimizer_pre", ctx.step, checked))

    def optimizer_post(self, ctx, optimizer, checked):
        self.calls.append(("optimizer_post", ctx.step, checked))

    def exit(self, ctx, exc):
        self.calls.append(("exit",))

    def summary(self):
        return {LR_PEAK: 7.0}


@pytest.fixture
def registered(monkeypatch):
    """Register extra measurement classes for one test."""
    def add(*classes):
        monkeypatch.setattr(M, "MEASUREMENTS", M.measurement_classes() + list(classes))
    return add


def test_a_measurement_follows_the_lifecycle_through_its_context(registered):
    registered(Recorder)
    r = run(steps=4, monitor={"optimizer": True, "every": 2}, set_step=True)
    rec = r.dbg.addon(Recorder)
    names = [c[0] for c in rec.calls]
    assert names[0] == "enter" and names[-1] == "exit" and set(names) <= set(HOOKS)
    # every step is announced with whether it is checked; only checked ones reach checked_step
    assert [c for c in rec.calls if c[0] == "step_started"] == [("step_started", s, s % 2 == 0) for s in (1, 2, 3)]
    assert [c[1] for c in rec.calls if c[0] == "checked_step"] == [0, 2]
    assert ("optimizer_pre", 2, True) in rec.calls and ("optimizer_post", 3, False) in rec.calls
    assert r.dbg.signatures().value(LR_PEAK) == 7.0  # its declared signature reaches the trace


class Typo(Measurement):
    signatures = (OUT_FEATURES,)

    def summary(self):
        return {Signature("out_featurez", "integer", "entry", "lead", "a misspelt name"): 3}


class Undeclared(Measurement):
    """Reports a declared signature that it does not list in its own ``signatures``."""

    def summary(self):
        return {OUT_FEATURES: 3}


class Invalid(Measurement):
    signatures = (LR_PEAK,)

    def summary(self):
        return {LR_PEAK: -1.0}  # lo = 0


@pytest.mark.parametrize("bad,message", [(Typo, "does not declare"), (Undeclared, "does not declare"),
                                         (Invalid, "out of range")])
def test_a_bad_signature_is_an_internal_error_and_is_left_out(registered, caplog, bad, message):
    registered(bad)
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        r = run(steps=3, monitor={"optimizer": True})
        sigs = r.dbg.signatures()
    assert r.dbg.internal_errors >= 1 and message in caplog.text
    assert "out_featurez" not in sigs.as_dict()
    assert sigs.value(OUT_FEATURES) == 3 and sigs.value(LR_PEAK) == 0.05  # the good parts' values stay


class Crashes(Measurement):
    def step_closed(self, ctx, step, checked):
        raise RuntimeError("boom")


def test_a_part_that_raises_never_stops_training_and_is_counted(registered, caplog):
    bare = run(steps=5)
    registered(Crashes)
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        r = run(steps=5, monitor={})
    assert all(torch.equal(a, b) for a, b in zip(bare.params, r.params))
    assert r.dbg.internal_errors == 5 and caplog.text.count("Crashes.step_closed") == 1  # logged once


def test_only_the_parts_that_do_something_on_a_hook_are_called():
    dbg = NeuralDbg(torch.nn.Linear(2, 2))
    assert not dbg._parts.wants("step_started")  # no reference loss: nothing to do as a step starts
    assert NeuralDbg(torch.nn.Linear(2, 2), reference=lambda m: torch.zeros(()))._parts.wants("step_started")
    with pytest.raises(TypeError, match="must be a neuraldbg.lifecycle.Addon"):
        type(dbg._parts)([object()], dbg._parts.ctx, dbg._safe)


def test_an_unchecked_step_calls_only_the_parts_that_ask_for_it(registered):
    class CheckedOnly(Recorder):
        unchecked = ()

    class PostOnly(Recorder):
        unchecked = ("optimizer_post",)

    registered(CheckedOnly, PostOnly, Recorder)
    r = run(steps=6, monitor={"every": 3})
    every, checked_only, post_only = (next(p for p in r.dbg._parts.all if type(p) is c)
                                      for c in (Recorder, CheckedOnly, PostOnly))
    step_calls = [c for c in every.calls if c[0] in ("step_started", "step_closed", "optimizer_pre", "optimizer_post")]
    assert any(not c[-1] for c in step_calls)  # a part without `unchecked` hears every step
    assert [c for c in checked_only.calls if c in step_calls] == [c for c in step_calls if c[-1]]
    assert [c for c in post_only.calls if c in step_calls] == \
        [c for c in step_calls if c[-1] or c[0] == "optimizer_post"]


def test_a_part_done_with_unchecked_steps_stops_hearing_them(registered):
    class Counter(Recorder):
        unchecked = ("optimizer_post",)

        def optimizer_post(self, ctx, optimizer, checked):
            super().optimizer_post(ctx, optimizer, checked)
            if sum(1 for c in self.calls if c[0] == "optimizer_post" and not c[-1]) == 2:
                ctx.unchecked_done(self, "optimizer_post")

    registered(Counter)
    r = run(steps=30, monitor={"every": 5})
    part = next(p for p in r.dbg._parts.all if type(p) is Counter)
    posts = [c for c in part.calls if c[0] == "optimizer_post"]
    assert sum(not c[-1] for c in posts) == 2  # then no more on unchecked steps ...
    assert sum(c[-1] for c in posts) == 6      # ... and still on every checked one
    with pytest.raises(ValueError, match="valid: step_started, step_closed, optimizer_pre, optimizer_post"):
        r.dbg._parts.retire_unchecked(part, "checked_step")


def test_a_part_done_with_a_hook_stops_hearing_it_on_every_step(registered):
    class Once(Recorder):
        def optimizer_pre(self, ctx, optimizer, checked):
            super().optimizer_pre(ctx, optimizer, checked)
            if checked:
                ctx.hook_done(self, "optimizer_pre")

    registered(Once)
    r = run(steps=30, monitor={"every": 5})
    part = next(p for p in r.dbg._parts.all if type(p) is Once)
    pres = [c for c in part.calls if c[0] == "optimizer_pre"]
    assert pres and pres[-1][-1] and sum(c[-1] for c in pres) == 1  # heard up to its first checked step only
    assert sum(c[0] == "optimizer_post" for c in part.calls) > 1    # its other hooks still heard
    with pytest.raises(ValueError, match="is not a lifecycle hook; valid: "):
        r.dbg._parts.retire(part, "no_such_hook")
