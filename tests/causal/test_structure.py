"""The network declaration: one place, consistent, acyclic, parents sorted."""
import pytest

from neuraldbg.causal import structure as S
from neuraldbg.causal.structure import default_network

NET = default_network()


def test_roots_match_api_md():
    assert S.ROOTS == {
        "learning_rate": ("ok", "too_high", "too_low"),
        "initialization": ("ok", "too_small", "too_large"),
        "data": ("ok", "corrupted", "shifted"),
        "architecture": ("ok", "unstable"),
        "training_loop": ("ok", "stale_gradients", "params_not_in_optimizer", "graph_detached",
                          "loss_on_probabilities"),
        "numerics": ("ok", "overflow", "updates_lost"),
        "unexplained": ("ok", "not_learning"),
    }


def test_every_node_has_sorted_known_parents_and_is_declared_after_them():
    seen = set(S.ROOTS)
    for node in NET.nodes:
        assert list(node.parents) == sorted(node.parents)
        assert set(node.parents) <= seen, node.name
        seen.add(node.name)


def test_latent_mechanism_carries_the_correlated_instability_symptoms():
    children = {child for parent, child in NET.edges() if parent == "instability"}
    assert {"exploding", "loss_pattern", "data_nan", "dead"} <= children
    # no data or optimization root points straight at the exploding-gradient symptom: only
    # mechanisms do (corrupted values: non-finite gradients are a direct consequence, not
    # instability), and an overflow, whose non-finite weights give infinite gradients directly
    assert {p for p, c in NET.edges() if c == "exploding"} == {"corruption", "instability", "numerics"}


def test_states_and_parents_lookup_errors_name_valid_variables():
    assert NET.states_of("data") == ("ok", "corrupted", "shifted")
    assert NET.parents_of("learning_rate") == ()
    assert NET.parents_of("loss_pattern") == ("corruption", "data", "instability", "learning_rate", "numerics",
                                              "signal_decay", "unexplained")
    with pytest.raises(KeyError, match="valid: .*learning_rate"):
        NET.states_of("nope")
    with pytest.raises(KeyError):
        NET.parents_of("nope")


def test_all_variables_partition():
    allv = NET.all_variables()
    assert len(allv) == len(set(allv))
    assert set(allv) == set(S.ROOTS) | set(NET.latent_names) | set(NET.evidence_names)
    assert set(NET.latent_names) == {"corruption", "instability", "signal_decay"}


def test_normal_state_is_first_everywhere():
    for node in NET.nodes:
        if isinstance(node, S.NoisyMax):
            assert node.states[0] not in node.leak
            for dist in node.effects.values():
                assert node.states[0] not in dist


def test_the_network_is_a_value_checked_on_construction():
    nodes = NET.nodes
    assert S.Network(nodes).fingerprint == NET.fingerprint  # the same structure, the same fingerprint
    assert len(NET.fingerprint) == 40 and NET.evidence_names[0] == "exploding"
    bare = S.NoisyMax("extra", ("absent", "present"), leak={"present": 0.1},
                      effects={"data=corrupted": {"present": 0.5}})
    with pytest.raises(ValueError, match="extra: an evidence node needs an extractor"):
        S.Network(nodes + (bare,))
    other = S.Network(nodes + (S.NoisyMax("extra", ("absent", "present"), leak={"present": 0.1},
                                           effects={"data=corrupted": {"present": 0.5}},
                                           extract=lambda view: None),))
    assert other.fingerprint != NET.fingerprint and "extra" in other.evidence_names
    with pytest.raises(ValueError, match="declared twice"):
        S.Network(nodes + (nodes[-1],))
    unsorted = S.Table("u", ("a", "b"), ("learning_rate", "data"), (({}, (0.5, 0.5)),), extract=lambda v: None)
    with pytest.raises(ValueError, match="parents must be sorted"):
        S.Network(nodes + (unsorted,))


def test_every_evidence_node_reads_the_trace_and_says_why_not():
    from neuraldbg.causal.evidence import extract
    from neuraldbg.trace import Trace

    ev = extract(Trace(events=(), layers=(), family="mlp"))
    assert set(ev.observed) | set(ev.unobserved) == set(NET.evidence_names)
    assert ev.unobserved["step_size"] == "no optimizer step was measured"
    assert ev.unobserved["exploding"] == "no monitored layer owns parameters"
