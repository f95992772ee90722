"""The result records: frozen, plain, printable."""
import dataclasses
import pickle

import pytest

from neuraldbg.causal.types import CausalChain, Coupling, Hypothesis, Posterior
from neuraldbg.events.base import make_event


def test_records_are_frozen_and_picklable():
    e = make_event("gradient_health_transition", "exploding", "fc1", 3, 2.0, {"grad_rms": 1e4})
    h = Hypothesis("learning_rate", "too_high", 0.9, "exploding_gradients", "fc1", 3, (e,), "fix it.", "desc")
    c = CausalChain("exploding_gradients", "learning_rate", "too_high", 0.9, e, ())
    k = Coupling("vanishing", "saturated", ("a", "b"), "adjacent_layers", 1.0, 3.0, 4, 1.0, 0.01, 0)
    for rec in (h, c, k):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(rec, dataclasses.fields(rec)[0].name, "x")
        assert pickle.loads(pickle.dumps(rec)) == rec
    assert str(h) == "desc"
    assert c.first_layer == "fc1" and c.first_step == 3 and c.events == (e,)


def test_empty_chain_is_falsy():
    c = CausalChain("dead_neurons", None, None, 0.0, None, (), reason="no dead_neurons event")
    assert not c and c.first_layer is None and c.first_step is None
    assert str(c) == "dead_neurons: no chain (no dead_neurons event)"


def test_long_chain_prints_elided():
    evs = [make_event("gradient_health_transition", "vanishing", str(i), 0, 1.0) for i in range(20)]
    c = CausalChain("vanishing_gradients", "architecture", "unstable", 0.9, evs[0], tuple(evs[1:]))
    assert "... 12 more" in str(c)


def test_posterior_abnormal_ranking():
    p = Posterior({"learning_rate": {"ok": 0.2, "too_high": 0.7, "too_low": 0.1},
                   "data": {"ok": 0.9, "corrupted": 0.05, "shifted": 0.05}}, 0.15)
    assert p.abnormal()[0] == ("learning_rate", "too_high", 0.7)
    assert p["healthy"] == {"yes": 0.15, "no": 0.85}
    assert "p_healthy=0.1500" in repr(p)
