"""The network declaration: one place, consistent, acyclic, parents sorted."""
import pytest

from neuraldbg.causal import structure as S


def test_roots_match_api_md():
    assert S.ROOTS == {
        "learning_rate": ("ok", "too_high", "too_low"),
        "initialization": ("ok", "too_small", "too_large"),
        "data": ("ok", "corrupted", "shifted"),
        "architecture": ("ok", "unstable"),
    }


def test_every_node_has_sorted_known_parents_and_is_declared_after_them():
    seen = set(S.ROOTS)
    for node in S.NODES:
        assert list(node.parents) == sorted(node.parents)
        assert set(node.parents) <= seen, node.name
        seen.add(node.name)


def test_latent_mechanism_carries_the_correlated_instability_symptoms():
    children = {child for parent, child in S.edges() if parent == "instability"}
    assert {"exploding", "loss_pattern", "data_nan", "dead"} <= children
    # no root points straight at the exploding-gradient symptom except through a mechanism
    # (data=corrupted: non-finite gradients are a direct consequence, not instability)
    assert {p for p, c in S.edges() if c == "exploding"} == {"data", "instability"}


def test_states_and_parents_lookup_errors_name_valid_variables():
    assert S.states_of("data") == ("ok", "corrupted", "shifted")
    assert S.parents_of("learning_rate") == ()
    assert S.parents_of("loss_pattern") == ("data", "instability", "learning_rate", "signal_decay")
    with pytest.raises(KeyError, match="valid: .*learning_rate"):
        S.states_of("nope")
    with pytest.raises(KeyError):
        S.parents_of("nope")


def test_all_variables_partition():
    allv = S.all_variables()
    assert len(allv) == len(set(allv))
    assert set(allv) == set(S.ROOTS) | set(S.LATENT_NAMES) | set(S.EVIDENCE_NAMES)
    assert set(S.LATENT_NAMES) == {"instability", "signal_decay"}


def test_normal_state_is_first_everywhere():
    for node in S.NODES:
        if isinstance(node, S.NoisyMax):
            assert node.states[0] not in node.leak
            for dist in node.effects.values():
                assert node.states[0] not in dist
