import pytest

from neuraldbg.events.base import Event, validate_failure_type


def test_event_validation_names_valid_values():
    with pytest.raises(ValueError, match="valid: gradient_health_transition"):
        Event("gradient", "vanishing", "a", 0)
    with pytest.raises(ValueError, match="valid: vanishing, exploding"):
        Event("gradient_health_transition", "dead", "a", 0)
    with pytest.raises(ValueError, match="precedes"):
        Event("gradient_health_transition", "vanishing", "a", 5, end_step=3)
    with pytest.raises(ValueError, match="valid: vanishing_gradients"):
        validate_failure_type("nan_loss")


def test_event_is_frozen_hashable_and_round_trips():
    e = Event("data_anomaly", "nan", "fc1", 30, values={"nan_count": 3})
    assert e.end_step == 30 and e.measured == {"nan_count": 3.0}
    assert Event.from_dict(e.to_dict()) == e
    assert hash(e) == hash(Event.from_dict(e.to_dict()))
    with pytest.raises(AttributeError):
        e.step = 3
    with pytest.raises(ValueError, match="unknown event fields"):
        Event.from_dict({**e.to_dict(), "bogus": 1})


def test_make_event_builds_the_same_event_as_the_validating_constructor():
    from neuraldbg.events.base import make_event
    from neuraldbg.vocab import GRADIENT

    ev = make_event(GRADIENT, "vanishing", "fc1", 12, 2, {"b": 2, "a": 1.5})
    want = Event(type=GRADIENT, kind="vanishing", layer="fc1", step=12, severity=2.0,
                 values=(("a", 1.5), ("b", 2.0)))
    assert ev == want and hash(ev) == hash(want) and ev.end_step == 12 and ev.count == 1 and ev.rank is None
    assert ev.to_dict() == want.to_dict()
    with pytest.raises(ValueError, match="valid"):
        make_event(GRADIENT, "melting", "fc1", 1, 1.0)
    assert make_event(GRADIENT, "vanishing", None, 3, 1.0, rank=2).rank == 2


def test_make_events_builds_the_events_make_event_builds_one_by_one():
    import numpy as np
    import pytest

    from neuraldbg.events.base import make_event, make_events
    from neuraldbg.vocab import GRADIENT

    layers, sev = ["a", "b", None], [1.0, np.float64(2.5), 3]
    cols = {"z": [1, 2, 3], "a": np.array([0.5, 0.25, 0.125]), "m": [np.float32(7.0), 8.0, 9.0]}
    got = make_events(GRADIENT, "vanishing", layers, 12, sev, cols)
    want = [make_event(GRADIENT, "vanishing", layer, 12, s, {k: v[j] for k, v in cols.items()})
            for j, (layer, s) in enumerate(zip(layers, sev))]
    assert got == want and [repr(e) for e in got] == [repr(e) for e in want]
    assert all(type(v) is float for e in got for _, v in e.values) and got[0].values[0] == ("a", 0.5)
    assert make_events(GRADIENT, "vanishing", [], 3, [], {"x": []}) == []
    with pytest.raises(ValueError, match="valid"):
        make_events(GRADIENT, "melting", ["a"], 1, [1.0], {"x": [1.0]})
