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
