"""Couplings: lift against chance over (layer, step-bin) cells, with lag."""
import math

import pytest

from neuraldbg.causal import couplings as C
from neuraldbg.causal.api import couplings
from scenarios import act, grad, loss_event, mlp_layers, trace


def sigmoid_trace():
    """Saturation in the sigmoid after each of the first 4 linears, vanishing in those linears
    a few steps later; the rest of the 10-layer stack is quiet."""
    layers = mlp_layers(10, "Sigmoid", 32)  # 19 modules: Linear at even, Sigmoid at odd indices
    ev = []
    for k in range(4):
        ev.append(act("saturated", str(2 * k + 1), 10, 59))
        ev.append(grad("vanishing", str(2 * k), 13, 59))
    ev.append(loss_event("plateau", 50, 59))
    return trace(ev, layers=layers)


def test_vanishing_with_saturation_is_the_canonical_coupling():
    cps = couplings(sigmoid_trace())
    pair = [c for c in cps if {c.kind_a, c.kind_b} == {"saturated", "vanishing"}]
    assert pair, cps
    c = pair[0]
    assert (c.kind_a, c.kind_b) == ("saturated", "vanishing")  # saturation starts first
    assert c.relation == "adjacent_layers"
    assert c.lag == pytest.approx(3.0)
    assert c.strength > 2 and c.co_occurrences > c.expected and c.p_value < 1e-3
    assert c.first_step == 10
    assert "lift" in str(c) and "lag +3" in str(c)


def test_kinds_far_apart_are_not_coupled():
    layers = mlp_layers(10, "ReLU", 32)
    tr = trace([grad("exploding", "0", 2, 4), act("dead", "17", 50, 55)], layers=layers)
    assert couplings(tr) == []


def test_time_proximity_alone_is_not_coupling():
    # a kind active in every cell co-occurs with anything, so its lift is ~1
    layers = mlp_layers(4, "ReLU", 32)
    ev = [grad("vanishing", str(i), 0, 59) for i in range(7)]
    ev.append(act("dead", "3", 20, 25))
    cps = couplings(trace(ev, layers=layers))
    assert not [c for c in cps if {c.kind_a, c.kind_b} == {"vanishing", "dead"}]


def test_hypergeometric_tail_matches_scipy():
    from scipy.stats import hypergeom

    for k, N, K, n in [(3, 100, 10, 10), (0, 50, 5, 5), (7, 1000, 40, 30), (12, 2000, 300, 60)]:
        assert C._hypergeom_sf(k, N, K, n) == pytest.approx(hypergeom.sf(k - 1, N, K, n), rel=1e-9, abs=1e-300)


def test_coupling_record_is_json_ready():
    import json

    c = couplings(sigmoid_trace())[0]
    d = c.to_dict()
    json.dumps(d)
    assert isinstance(d["layers"], list) and not math.isnan(d["strength"])
