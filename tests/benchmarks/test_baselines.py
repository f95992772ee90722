"""Rule baselines: distributions over the benchmark labels from exported traces."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import baselines as B
from benchmarks.metrics import LABELS
from neuraldbg.events.base import EVENT_KINDS, Event


def _session(*events, first=2.0, last=0.3, nonfinite=0):
    return {"events": [e.to_dict() for e in events], "loss": {"first": first, "last": last, "n_nonfinite": nonfinite}}


def test_first_event_no_event_is_healthy():
    q = B.first_event(_session())
    assert max(q, key=q.get) == "healthy"
    assert q["healthy"] == pytest.approx(B.NO_EVENT_CONFIDENCE + (1 - B.NO_EVENT_CONFIDENCE) / len(LABELS))


def test_first_event_uses_the_earliest_event_only():
    s = _session(Event("gradient_health_transition", "exploding", "fc2", 40),
                 Event("data_anomaly", "nan", "fc1", 30))
    q = B.first_event(s)
    assert max(q, key=q.get) == "data/corrupted"
    assert q["data/corrupted"] == pytest.approx(0.9 + 0.1 / len(LABELS))


def test_threshold_rules_vote_and_fall_back_to_healthy():
    assert B.fired_rules(_session()) == []
    q = B.threshold_rules(_session())
    assert max(q, key=q.get) == "healthy"
    s = _session(Event("gradient_health_transition", "vanishing", "fc1", 0),
                 Event("activation_regime_shift", "saturated", "fc1", 0))
    assert B.fired_rules(s) == ["VanishingGradient", "SaturatedActivation"]
    q = B.threshold_rules(s)
    assert max(q, key=q.get) == "architecture/unstable"
    assert q["architecture/unstable"] == pytest.approx(0.95 * (0.5 + 0.6) / 2 + 0.05 / len(LABELS))


def test_loss_not_decreasing_reads_the_loss_summary():
    assert "LossNotDecreasing" in B.fired_rules(_session(first=2.0, last=1.95))
    assert "ExplodingTensor" in B.fired_rules(_session(nonfinite=3))
    assert B.fired_rules(_session(first=2.0, last=float("nan"))) == []


def test_view_accepts_event_lists_and_monitor_like_objects():
    ev = [Event("optimizer_instability", "spike", None, 5)]
    assert B.view(ev).kinds() == {"spike"}

    class Mon:
        events = ev

    assert B.fired_rules(Mon()) == ["OscillatingLoss"]


ALL_KINDS = [(t, k) for t, ks in EVENT_KINDS.items() for k in ks]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ALL_KINDS), st.integers(0, 100)), max_size=6),
       st.floats(0.01, 10), st.floats(0.01, 10))
def test_baselines_are_distributions_over_the_labels(evs, first, last):
    s = _session(*[Event(t, k, None if t == "optimizer_instability" else "fc1", step) for (t, k), step in evs],
                 first=first, last=last)
    for q in B.run_all(s).values():
        assert list(q) == list(LABELS)
        assert math.isclose(sum(q.values()), 1.0, rel_tol=1e-9)
        assert min(q.values()) > 0  # no label impossible: log loss stays finite
