"""The interventional likelihoods: file validation, the table rule, and the posterior update
cross-checked against pgmpy on the network extended by one node per test."""
from __future__ import annotations

import json

import numpy as np
import pytest

from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.cpd import build_cpds
from neuraldbg.causal.priors import load_priors
from neuraldbg.causal.structure import default_network
from neuraldbg.verify import likelihoods as L
from neuraldbg.vocab import ABNORMAL_LABELS, HEALTHY

NET = default_network()


def test_shipped_file_is_valid_and_hand_set_table_is_diagonal_dominant():
    data = L.load()
    assert set(data["hand_set"]) == set(L.TESTED_LABELS) and set(L.TESTED_LABELS) < set(ABNORMAL_LABELS)
    for test in L.TESTED_LABELS:
        row = data["hand_set"][test]
        # by design the fix of the true cause makes its symptom vanish more often than a
        # healthy run "improves"; fitted tables may say otherwise where the data does (a x10
        # rate cannot rescue a rate 10,000x too low in 20 steps), within the clip
        assert row[test] > row[HEALTHY], (test, row)
    for fam in ("mlp", "gan", "transformer", None):
        for row in L.table_for(fam, data).values():
            assert all(0.01 - 1e-12 <= p <= 0.99 + 1e-12 for p in row.values())


def test_likelihood_rule_single_multiple_and_healthy():
    table = L.load()["hand_set"]
    p = L.likelihood(table, "learning_rate/too_high", "vanished")
    # architecture, data, initialization, learning_rate, numerics, training_loop, unexplained (sorted roots)
    cards = (2, 3, 3, 3, 3, 5, 2)
    idx = lambda a=0, d=0, i=0, lr=0, n=0, tl=0, u=0: int(  # noqa: E731
        np.ravel_multi_index((a, d, i, lr, n, tl, u), cards))
    row = table["learning_rate/too_high"]
    assert p[idx()] == row[HEALTHY]
    assert p[idx(lr=1)] == row["learning_rate/too_high"]
    assert p[idx(i=2)] == row["initialization/too_large"]
    assert p[idx(lr=1, i=2)] == min(row["learning_rate/too_high"], row["initialization/too_large"])
    assert p[idx(tl=1)] == row["training_loop/stale_gradients"] and p[idx(u=1)] == row["unexplained/not_learning"]
    assert p[idx(n=1)] == row["numerics/overflow"] and p[idx(n=2)] == row["numerics/updates_lost"]
    q = L.likelihood(table, "learning_rate/too_high", "persisted")
    assert np.allclose(p + q, 1.0)
    with pytest.raises(ValueError, match="valid: persisted, vanished"):
        L.likelihood(table, "learning_rate/too_high", "gone")


def test_invalid_files_name_the_field(tmp_path):
    good = json.loads(L.shipped_path().read_text())
    bad = dict(good, hand_set={**good["hand_set"], "learning_rate/too_high": {HEALTHY: 0.5}})
    path = tmp_path / "v.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(L.LikelihoodError, match="hand_set.learning_rate/too_high: expected one probability per label"):
        L.load(path)
    path.write_text(json.dumps(dict(good, extra=1)))
    with pytest.raises(L.LikelihoodError, match="unknown keys"):
        L.load(path)
    bad_p = json.loads(json.dumps(good))
    bad_p["hand_set"]["data/shifted"]["healthy"] = 1.0
    path.write_text(json.dumps(bad_p))
    with pytest.raises(L.LikelihoodError, match=r"data/shifted.healthy: expected a probability in \(0, 1\)"):
        L.load(path)


@pytest.mark.parametrize("family", ["mlp", "transformer"])
def test_update_matches_pgmpy_with_verify_nodes(family):
    pri = load_priors(family=family)
    cpds = build_cpds(pri.roots, pri.cpds, NET)
    net = CompiledNetwork(cpds, NET, temperature=1.0)  # pgmpy has no temperature
    table = L.load()["hand_set"]
    evidence = {"exploding": "init", "loss_start": "high", "loss_pattern": "divergence"}
    tests = [("initialization/too_large", "vanished"), ("learning_rate/too_high", "persisted"),
             ("data/shifted", "persisted")]
    joint = L.update(net.root_joint_posterior(evidence), tests, table)
    marg, p_ok = L.marginals(joint)
    ref_marg, ref_ok = L.reference_update(cpds, evidence, tests, table)
    assert p_ok == pytest.approx(ref_ok, abs=1e-9)
    for var, dist in ref_marg.items():
        for s, p in dist.items():
            assert marg[var][s] == pytest.approx(p, abs=1e-9), (var, s)
    # and the update moved belief the right way
    before, _ = L.marginals(net.root_joint_posterior(evidence) / net.root_joint_posterior(evidence).sum())
    assert marg["initialization"]["too_large"] > before["initialization"]["too_large"]
    assert marg["learning_rate"]["too_high"] < before["learning_rate"]["too_high"]


def test_a_file_fitted_under_another_outcome_rule_is_refused(tmp_path):
    good = json.loads(L.shipped_path().read_text())
    path = tmp_path / "v.json"
    path.write_text(json.dumps(dict(good, outcome={**good["outcome"], "rule": "loss only"})))
    with pytest.raises(L.LikelihoodError, match="outcome.rule is 'loss only'.*refit the tables"):
        L.load(path)


def test_fit_refuses_tests_decided_by_the_loss_only_rule():
    from neuraldbg.verify import tune as F

    test = {"cause": "learning_rate", "state": "too_high", "outcome": "vanished"}
    rec = {"key": "mlp__lr_too_high__0", "family": "mlp", "true_cause": "learning_rate", "true_state": "too_high",
           "error": "", "verify_tests": json.dumps([test])}
    with pytest.raises(ValueError, match="mlp__lr_too_high__0: .*earlier outcome rule"):
        F.cases_from_records([rec])
    rec["verify_tests"] = json.dumps([dict(test, symptoms=0, symptoms_after=0)])
    assert F.cases_from_records([rec]) == [("mlp", "learning_rate/too_high", "learning_rate/too_high", "vanished")]
