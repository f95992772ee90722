"""The compiled enumeration: distributions, marginalization, monotone evidence, batches."""
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuraldbg.causal import structure as S
from neuraldbg.causal.compiled import CompiledNetwork, ImpossibleEvidence
from neuraldbg.causal.cpd import Cpd, build_cpds
from neuraldbg.causal.priors import load_priors
from neuraldbg.causal.structure import default_network
from neuraldbg.vocab import FAMILIES

NET = default_network()


@functools.lru_cache(maxsize=None)
def net_for(family="mlp", temperature=1.0, hand_set=False):
    """The family's network; ``hand_set`` asks for the noisy-OR tables the shipped (possibly
    fitted) file started from, which is what the structural tests are about."""
    pri = load_priors(family)
    if hand_set:
        from neuraldbg.fit import hand_set_base

        pri = hand_set_base(pri)
    return CompiledNetwork(build_cpds(pri.roots, pri.cpds, NET), NET, temperature=temperature)


evidence_st = st.dictionaries(
    st.sampled_from(NET.evidence_names), st.integers(min_value=0, max_value=10)
).map(lambda d: {k: NET.states_of(k)[i % len(NET.states_of(k))] for k, i in d.items()})


@settings(max_examples=200, deadline=None)
@given(family=st.sampled_from(FAMILIES), evidence=evidence_st)
def test_posteriors_are_distributions(family, evidence):
    marg, p_ok = net_for(family).posterior(evidence)
    assert set(marg) == set(S.ROOTS)
    for v, d in marg.items():
        assert list(d) == list(S.ROOTS[v])
        assert all(0.0 <= p <= 1.0 for p in d.values())
        assert sum(d.values()) == pytest.approx(1.0, abs=1e-12)
    assert 0.0 <= p_ok <= min(d["ok"] for d in marg.values()) + 1e-12


def test_no_evidence_gives_the_priors():
    pri = load_priors("rl")
    marg, p_ok = net_for("rl").posterior({})
    for v, d in pri.roots.items():
        for s, p in d.items():
            assert marg[v][s] == pytest.approx(p, abs=1e-12)
    assert p_ok == pytest.approx(pri.p_healthy(), abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(evidence=evidence_st, var=st.sampled_from(NET.evidence_names))
def test_unobserved_is_marginalized_not_absent(evidence, var):
    # observing nothing about var equals averaging over its states with their predictive weights
    net = net_for()
    evidence.pop(var, None)
    base = net.root_joint_posterior(evidence)
    both = net.root_joint_posterior({**evidence, var: NET.states_of(var)})
    np.testing.assert_allclose(base, both, atol=1e-12)
    absent = net.root_joint_posterior({**evidence, var: NET.states_of(var)[0]})
    # (observing the normal state is evidence; it is not what "unobserved" means)
    assert not np.allclose(base, absent, atol=1e-6) or var == "order"


# evidence that only one cause explains: its likelihood depends on that root alone and is
# largest at the named state, so adding it can only raise that state's posterior
SINGLE_CAUSE = [
    ("data_nan", "input", "data", "corrupted"),
    ("data_shift", "input", "data", "shifted"),
    ("depth_risk", "deep_saturating", "architecture", "unstable"),
]


@pytest.mark.parametrize("var,state,cause,cause_state", SINGLE_CAUSE)
@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(FAMILIES), evidence=evidence_st)
def test_single_cause_evidence_raises_that_cause(var, state, cause, cause_state, family, evidence):
    net = net_for(family)
    evidence.pop(var, None)
    before = net.posterior(evidence)[0][cause][cause_state]
    after = net.posterior({**evidence, var: state})[0][cause][cause_state]
    assert after >= before - 1e-12
    assert after > before or before > 1 - 1e-9


def test_single_cause_examples_really_depend_on_one_root_only():
    net = net_for(hand_set=True)
    for var, state, cause, cause_state in SINGLE_CAUSE:
        m = net.root_likelihood[var][:, net.state_pos[var][state]]
        idx = np.unravel_index(np.arange(net.n_root_joint), net.root_cards)
        k = S.ROOT_NAMES.index(cause)
        for s in range(len(S.ROOTS[cause])):
            vals = m[idx[k] == s]
            assert np.ptp(vals) < 1e-12, (var, s)  # other roots do not matter
        best = max(range(len(S.ROOTS[cause])), key=lambda s: m[idx[k] == s][0])
        assert S.ROOTS[cause][best] == cause_state


@settings(max_examples=30, deadline=None)
@given(cases=st.lists(evidence_st, min_size=1, max_size=8))
def test_batch_equals_single(cases):
    net = net_for("cnn")
    marg, p_ok = net.posterior_batch(net.cases(cases))
    for i, ev in enumerate(cases):
        m1, p1 = net.posterior(ev)
        assert p_ok[i] == pytest.approx(p1, abs=1e-12)
        for v in S.ROOTS:
            np.testing.assert_allclose(marg[v][i], [m1[v][s] for s in S.ROOTS[v]], atol=1e-12)


def test_temperature_flattens_the_posterior():
    ev = {"exploding": "later", "loss_pattern": "divergence", "order": "grad_first"}
    sharp = net_for("mlp", 1.0).posterior(ev)[0]["learning_rate"]["too_high"]
    soft = net_for("mlp", 2.0).posterior(ev)[0]["learning_rate"]["too_high"]
    prior = load_priors("mlp").roots["learning_rate"]["too_high"]
    assert prior < soft < sharp
    with pytest.raises(ValueError, match="temperature"):
        CompiledNetwork(build_cpds(load_priors().roots, None, NET), NET, temperature=0)


def test_bad_evidence_names_and_states_are_rejected_clearly():
    net = net_for()
    with pytest.raises(ValueError, match="unknown evidence variable 'nope'; valid: exploding"):
        net.posterior({"nope": "x"})
    with pytest.raises(ValueError, match="unknown state 'huge' of exploding; valid: absent, later, init"):
        net.posterior({"exploding": "huge"})
    with pytest.raises(ValueError, match="set"):
        net.encode({"exploding": ("later", "init")})


def test_zero_probability_evidence_raises():
    pri = load_priors()
    cpds = build_cpds(pri.roots, None, NET)
    c = cpds["depth_risk"]
    vals = np.zeros_like(c.values)
    vals[0] = 1.0  # a fitted table that never produces deep stacks
    cpds["depth_risk"] = Cpd(c.name, c.states, c.parents, vals)
    with pytest.raises(ImpossibleEvidence):
        CompiledNetwork(cpds, NET).posterior({"depth_risk": "deep"})


def test_likelihood_ratio_matches_direct_computation():
    net = net_for(hand_set=True)
    lr = net.likelihood_ratio("data_nan", "input", "data", "corrupted")
    m = net.root_likelihood["data_nan"]
    col = net.state_pos["data_nan"]["input"]
    assert lr == pytest.approx(m[net.root_joint_index({"data": "corrupted"}), col] / m[0, col])
    assert lr > 100
    assert net.likelihood_ratio("data_nan", "input", "learning_rate", "too_high") == pytest.approx(1.0)


def test_an_excluded_root_state_has_probability_zero_and_the_rest_is_conditioned_on_it():
    net = net_for("mlp")
    ev = {"progress": "stalled", "loss_pattern": "flat"}
    marg, p_ok = net.posterior(ev)
    ex_marg, ex_ok = net.posterior(ev, [("learning_rate", "too_low")])
    assert ex_marg["learning_rate"]["too_low"] == 0.0
    keep = 1.0 - marg["learning_rate"]["too_low"]
    assert ex_marg["learning_rate"]["too_high"] == pytest.approx(marg["learning_rate"]["too_high"] / keep)
    assert ex_ok == pytest.approx(p_ok / keep)
    assert sum(ex_marg["data"].values()) == pytest.approx(1.0)
