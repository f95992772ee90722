"""Predictions of the fitter's batched path (``neuraldbg/fit/select.py``) exclude what a run lacks
the preconditions of, as the online diagnosis does.

Regression: the benchmark report's cross-validated and re-scored columns gave root states a run
cannot have (``data/corrupted`` without non-finite or label evidence, a healthy run whose loss
stayed at chance level) their posterior share, so the ecosystem suite re-scored with the shipped
priors read 0.972 where its online diagnoses read 0.980."""
from __future__ import annotations

import numpy as np
import pytest

import neuraldbg.fit as T
from neuraldbg.causal.compiled import HEALTHY_KEY, CompiledNetwork
from neuraldbg.causal.cpd import build_cpds
from neuraldbg.causal.priors import load_priors
from neuraldbg.causal.structure import ROOT_NAMES, ROOTS, default_network
from neuraldbg.fit.select import predict, rule_out

NET = default_network()
PRI = load_priors("mlp")
CPDS = build_cpds(PRI.roots, PRI.cpds, NET)
OK = {v: "ok" for v in ROOT_NAMES}
#: a run that stalled: flat loss, no other symptom
STALLED = {"loss_pattern": "flat", "progress": "stalled", "exploding": "absent", "data_nan": "absent"}


def _run(ruled_out=()) -> T.Run:
    return T.Run(key="r", family="mlp", truth=OK, evidence=STALLED, ruled_out=tuple(ruled_out))


def test_a_ruled_out_state_gets_probability_zero_and_the_rest_is_renormalized():
    low = ROOTS["learning_rate"].index("too_low")
    free = predict(CPDS, [_run()])
    assert free.marginals["learning_rate"][0, low] > 0.01 and free.p_healthy[0] > 0
    p = predict(CPDS, [_run([("learning_rate", "too_low"), HEALTHY_KEY]), _run()])
    assert p.marginals["learning_rate"][0, low] == 0.0 and p.p_healthy[0] == 0.0
    for v in ROOT_NAMES:
        assert p.marginals[v][0].sum() == pytest.approx(1.0)
    # the other run of the batch is untouched
    np.testing.assert_allclose(p.p_healthy[1], free.p_healthy[0])


def test_rule_out_keeps_a_row_it_would_empty():
    net = CompiledNetwork(CPDS, NET)
    ll = np.zeros((2, net.n_hidden))
    every = tuple((v, s) for v in ROOT_NAMES for s in net.states[v]) + (HEALTHY_KEY,)
    out = rule_out(net, ll, [_run(every), _run([HEALTHY_KEY])])
    assert np.isfinite(out[0]).all()                        # nothing would be left: kept
    assert np.isneginf(out[1][net.healthy_mask]).all() and np.isfinite(out[1][~net.healthy_mask]).all()
