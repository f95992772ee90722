"""CPD tables built from the declaration: noisy-MAX semantics and the strict check."""
import itertools

import numpy as np
import pytest

from neuraldbg.causal import structure as S
from neuraldbg.causal.cpd import Cpd, build_cpds, default_cpds, noisy_max_values, strict_check, table_values
from neuraldbg.causal.priors import load_priors
from neuraldbg.causal.structure import default_network

NET = default_network()


def test_binary_noisy_max_is_leaky_noisy_or():
    node = S.NoisyMax("y", ("no", "yes"), leak={"yes": 0.05},
                      effects={"architecture=unstable": {"yes": 0.6}, "data=corrupted": {"yes": 0.3},
                               "data=shifted": {"yes": 0.2}})
    v = noisy_max_values(node, NET)  # (2, arch 2, data 3)
    for a, d in itertools.product(range(2), range(3)):
        q = (1 - 0.05) * (1 - 0.6 * (a == 1)) * (1 - [0, 0.3, 0.2][d])
        assert v[0, a, d] == pytest.approx(q, abs=1e-15)
        assert v[1, a, d] == pytest.approx(1 - q, abs=1e-15)


def test_leak_alone_when_every_parent_is_normal():
    for node in NET.nodes:
        if isinstance(node, S.NoisyMax):
            v = noisy_max_values(node, NET)
            col = v[(slice(None),) + (0,) * len(node.parents)]
            expect = [1 - sum(node.leak.values())] + [node.leak.get(s, 0.0) for s in node.states[1:]]
            np.testing.assert_allclose(col, expect, atol=1e-15)


def test_an_active_cause_never_lowers_the_chance_of_any_higher_state():
    # stochastic dominance: P(Y >= y) grows when a parent switches from normal to abnormal
    for node in NET.nodes:
        if not isinstance(node, S.NoisyMax):
            continue
        v = noisy_max_values(node, NET)
        surv = 1 - np.cumsum(v, axis=0)
        for axis, parent in enumerate(node.parents, start=1):
            base = np.take(surv, [0], axis=axis)
            for s in range(1, v.shape[axis]):
                assert np.all(np.take(surv, [s], axis=axis) >= base - 1e-12), (node.name, parent)


def test_every_column_is_a_distribution():
    for name, cpd in default_cpds(NET).items():
        np.testing.assert_allclose(cpd.values_2d.sum(axis=0), 1.0, atol=1e-12)
        assert (cpd.values_2d > 0).all(), name  # leaks keep every configuration possible


def test_table_node_first_matching_row():
    node = NET.node_by_name["order"]
    v = table_values(node, NET)  # (3, data 3, instability 3)
    np.testing.assert_allclose(v[:, 1, 1], (0.15, 0.60, 0.25))  # corrupted wins over instability
    np.testing.assert_allclose(v[:, 0, 1], (0.60, 0.30, 0.10))  # instability=training
    np.testing.assert_allclose(v[:, 0, 0], (1 / 3,) * 3)


def test_build_cpds_uses_root_priors_and_overrides():
    pri = load_priors("rnn")
    cpds = build_cpds(pri.roots, None, NET)
    assert cpds["architecture"].values.tolist() == pytest.approx([0.85, 0.15])
    shape = cpds["depth_risk"].values_2d.shape
    over = {"depth_risk": {"values": [[0.5, 0.2], [0.25, 0.4], [0.25, 0.4]]}}
    assert shape == (3, 2)
    cpds2 = build_cpds(pri.roots, over, NET)
    np.testing.assert_allclose(cpds2["depth_risk"].values_2d, over["depth_risk"]["values"])


def test_strict_check_rejects_what_pgmpy_would_accept():
    bad = Cpd("x", ("a", "b"), (), np.array([0.5, 0.49]))
    with pytest.raises(ValueError, match="sums to 1"):
        strict_check({"x": bad})
    with pytest.raises(ValueError, match="negative"):
        strict_check({"x": Cpd("x", ("a", "b"), (), np.array([1.2, -0.2]))})
    strict_check({"x": Cpd("x", ("a", "b"), (), np.array([0.5, 0.5 + 1e-12]))})
