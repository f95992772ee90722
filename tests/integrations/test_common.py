"""What the framework callbacks share: one definition of a healthy run (``docs/api.md``), the
log lines, the live numbers once per statistics sync."""
from __future__ import annotations

import logging

import pytest

from neuraldbg.causal.types import HEALTHY_AT, Hypothesis, Posterior
from neuraldbg.integrations import common


def _hypothesis(p: float) -> Hypothesis:
    return Hypothesis(cause="learning_rate", state="too_high", probability=p, failure_type="optimizer_instability",
                      origin_layer=None, onset_step=None, evidence=(), suggested_fix="Lower the learning rate.",
                      description=f"learning_rate is too high (p={p:.2f}).")


class StubMonitor:
    """A finished monitor whose posterior is given: P(healthy) and one hypothesis."""

    def __init__(self, p_healthy: float, top: float):
        self.post = Posterior({"learning_rate": {"ok": 1 - top, "too_high": top, "too_low": 0.0}}, p_healthy)
        self.hyps = [_hypothesis(top)] if top >= 0.2 else []

    def __exit__(self, *exc):
        return False

    def posterior(self):
        return self.post

    def get_causal_hypotheses(self):
        return self.hyps


def test_a_run_the_posterior_calls_healthy_is_no_warning(caplog):
    """Regression: a top hypothesis of 0.42 with P(healthy) 0.57 was logged as a WARNING and
    ``diagnosis.healthy`` was False, while the posterior says the run is more likely healthy."""
    caplog.set_level(logging.DEBUG, logger="neuraldbg")
    d = common.finish(StubMonitor(0.57, 0.42), None, None)
    assert d.healthy and d.healthy == StubMonitor(0.57, 0.42).post.is_healthy
    (rec,) = [r for r in caplog.records if r.name == "neuraldbg"]
    assert rec.levelno == logging.INFO
    assert rec.getMessage().startswith("neuraldbg: no failure found (P(healthy) = 0.570); weaker leads:")
    assert "learning_rate is too high (p=0.42)" in rec.getMessage()


@pytest.mark.parametrize("p_healthy, top, healthy, level, start", [
    (0.95, 0.05, True, logging.INFO, "no failure found (P(healthy) = 0.950)"),
    (0.12, 0.85, False, logging.WARNING, "diagnosis (P(healthy) = 0.120):"),
    (0.45, 0.15, False, logging.WARNING, "something is off (P(healthy) = 0.450 < 0.5)"),
    (HEALTHY_AT, 0.3, True, logging.INFO, "no failure found"),
])
def test_one_verdict_everywhere(caplog, p_healthy, top, healthy, level, start):
    caplog.set_level(logging.DEBUG, logger="neuraldbg")
    d = common.finish(StubMonitor(p_healthy, top), None, None)
    assert d.healthy is healthy is (p_healthy >= HEALTHY_AT)
    (rec,) = [r for r in caplog.records if r.name == "neuraldbg"]
    assert rec.levelno == level and rec.getMessage().startswith("neuraldbg: " + start)


def test_other_ranks_log_at_debug_only(caplog):
    caplog.set_level(logging.DEBUG, logger="neuraldbg")
    common.finish(StubMonitor(0.1, 0.9), None, None, announce=False)
    assert [r.levelno for r in caplog.records if r.name == "neuraldbg"] == [logging.DEBUG]


def test_live_metrics_once_per_sync_and_states_kept_once_seen():
    from neuraldbg.examples import train_example

    dbg = train_example("mlp", "lr_too_high", seed=0, steps=40).dbg
    live = common.LiveMetrics()
    first = live.poll(dbg)
    assert first is not None and live.step == dbg.synced_step == 39
    assert live.poll(dbg) is None  # nothing new reached the host
    assert set(first) == {"neuraldbg/p_healthy", "neuraldbg/hypothesis/learning_rate=too_high"}
    assert first["neuraldbg/p_healthy"] == pytest.approx(dbg.posterior().p_healthy)


# ---- the one line a callback prints when the run ends ------------------------------------------

@pytest.mark.parametrize("p_healthy, top, start, has", [
    (0.95, 0.05, "no failure found (P(healthy) = 0.950)", None),
    (0.57, 0.42, "no failure found (P(healthy) = 0.570); weaker lead: learning_rate is too high (p=0.42)", None),
    (0.12, 0.85, "learning_rate is too high (p=0.85); fix: Lower the learning rate", "fix: "),
    (0.45, 0.15, "something is off (P(healthy) = 0.450 < 0.5) but no single cause", None),
])
def test_the_verdict_line_is_one_line_for_every_verdict(p_healthy, top, start, has):
    d = common.finish(StubMonitor(p_healthy, top), None, None)
    line = common.verdict_line(d)
    assert line.startswith(start) and "\n" not in line and ".;" not in line
    assert line.count("fix: ") == (1 if has else 0)
    assert "session at" not in line


def test_the_verdict_line_says_where_the_session_went():
    d = common.Diagnosis(p_healthy=0.98, hypotheses=(), text="", session_path="/runs/neuraldbg_session.json")
    assert common.verdict_line(d) == "no failure found (P(healthy) = 0.980); session at /runs/neuraldbg_session.json"


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_verbose_is_true_or_false_and_anything_else_names_both(bad):
    assert common.check_verbose(True) is True and common.check_verbose(False) is False
    with pytest.raises(TypeError, match=r"verbose must be True .* or False .*got "):
        common.check_verbose(bad)


def test_settle_takes_the_final_posterior_and_keeps_every_state_seen():
    """The last row a framework gets is the verdict's, with a column for each state logged before
    (so a state that faded has its final value) and each new one."""
    live = common.LiveMetrics()
    live.settle(Posterior({"learning_rate": {"ok": 0.3, "too_high": 0.7, "too_low": 0.0}}, 0.2))  # as at a sync
    step = live.step
    final = live.settle(Posterior({"learning_rate": {"ok": 0.9, "too_high": 0.05, "too_low": 0.05},
                                   "initialization": {"ok": 0.6, "too_large": 0.4}}, 0.55))
    assert final == {"neuraldbg/p_healthy": 0.55, "neuraldbg/hypothesis/learning_rate=too_high": 0.05,
                     "neuraldbg/hypothesis/initialization=too_large": 0.4}
    assert live.metrics == final and live.step == step


def test_finish_settles_the_live_numbers_on_the_verdict():
    live = common.LiveMetrics()
    d = common.finish(StubMonitor(0.12, 0.85), None, None, live=live)
    assert live.metrics == {"neuraldbg/p_healthy": d.p_healthy, "neuraldbg/hypothesis/learning_rate=too_high": 0.85}
