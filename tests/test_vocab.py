"""One definition of each vocabulary item: the zoo, the benchmark and the network read vocab.py."""
from __future__ import annotations

import json
from importlib import resources

from neuraldbg import vocab


def test_the_network_uses_the_vocabulary():
    from neuraldbg.causal.structure import default_network

    net = default_network()
    assert net.roots is vocab.ROOTS and net.root_names == vocab.ROOT_NAMES
    for var, states in vocab.ROOTS.items():
        assert net.states_of(var) == states and states[0] == "ok"


def test_the_zoo_uses_the_vocabulary():
    import models

    assert models.FAMILIES is vocab.FAMILIES
    for arch in models.architectures():
        assert models.family(arch) in vocab.FAMILIES
        for inj in models.injections(arch):
            assert inj.truth is None or inj.truth[1] in vocab.ROOTS[inj.truth[0]][1:]


def test_the_benchmark_uses_the_vocabulary():
    from benchmarks import metrics, records
    from benchmarks.ecosystem import architectures, family, injections

    assert metrics.LABELS == vocab.LABELS and metrics.ROOT_STATES is vocab.ROOTS
    assert [c for c in records.RECORD_COLUMNS if c.startswith("events_")] == \
        [f"events_{k}" for k in vocab.ALL_EVENT_KINDS]
    for arch in architectures():
        assert family(arch) in vocab.FAMILIES
        for inj in injections(arch):
            assert inj.truth is None or inj.truth[1] in vocab.ROOTS[inj.truth[0]][1:]


def test_every_family_ships_a_prior_file_and_events_use_the_kinds():
    from neuraldbg.events.base import EVENT_KINDS

    assert EVENT_KINDS is vocab.EVENT_KINDS
    for fam in vocab.FAMILIES:
        doc = json.loads(resources.files("neuraldbg.priors").joinpath(f"{fam}.json").read_text())
        assert doc["family"] == fam and set(doc["roots"]) == set(vocab.ROOTS)


def test_a_sentence_names_a_state_in_words_and_the_api_keeps_its_names():
    from neuraldbg.vocab import ROOTS, phrase

    assert phrase("learning_rate", "too_high") == "learning rate too high"
    assert phrase("training_loop", "stale_gradients") == "training loop: stale gradients"
    assert phrase("training_loop", "params_not_in_optimizer") == "training loop: parameters not in the optimizer"
    assert phrase("unexplained", "not_learning") == "unexplained: not learning"
    for cause, states in ROOTS.items():
        for state in states[1:]:
            assert "_" not in phrase(cause, state)
