"""The latent mechanisms (neuraldbg/causal/nodes/latent.py), read through the compiled network
with the hand-set tables: what one mechanism explains, the others' symptoms do not count against."""
from __future__ import annotations

import functools

import pytest

from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.cpd import build_cpds
from neuraldbg.causal.priors import load_priors
from neuraldbg.causal.structure import default_network
from neuraldbg.vocab import FAMILIES

NET = default_network()


@functools.lru_cache(maxsize=None)
def hand_set(family):
    return CompiledNetwork(build_cpds(load_priors(family).roots, None, NET), NET)


def corrupted(family, **evidence):
    marg, p_ok = hand_set(family).posterior(evidence)
    return marg["data"]["corrupted"], p_ok


@pytest.mark.parametrize("family", FAMILIES)
def test_an_absent_nan_is_no_evidence_against_corrupted_targets(family):
    """Regression: under one 'corrupted' state a NaN input was expected of every corruption, so
    shuffled labels -- whose inputs are finite and unshifted -- lost most of their posterior to
    the absent NaN: a LoRA GPT-2 whose labels were shuffled read healthy (0.93) or
    'unexplained' once its loss had gone back to chance. Corrupted targets show no NaN; only
    corrupted values do."""
    alone, _ = corrupted(family, target_fault="back_to_chance")
    finite, p_ok = corrupted(family, target_fault="back_to_chance", data_nan="absent", data_shift="absent")
    assert finite > 0.8 * alone
    assert p_ok < 0.5


@pytest.mark.parametrize("family", FAMILIES)
def test_corrupted_values_still_read_from_a_nan_input(family):
    p, p_ok = corrupted(family, data_nan="input", loss_pattern="nonfinite")
    assert p > 0.5 and p_ok < 0.5
    # and a return to chance is no witness of NaN values: it leaves the corrupted share of the
    # posterior where the NaN put it, or raises it
    both, _ = corrupted(family, data_nan="input", loss_pattern="nonfinite", target_fault="absent")
    assert both > 0.8 * p
