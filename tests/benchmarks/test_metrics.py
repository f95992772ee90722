"""Metric functions on hand-computed cases, plus a few properties."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from benchmarks import metrics as M


def _records(rows):
    base = {c: 0.0 for c in M.posterior_columns()}
    out = []
    for r in rows:
        d = dict(base)
        d.update(r)
        out.append(d)
    return pd.DataFrame(out)


def test_label_space_is_healthy_plus_every_abnormal_root_state():
    assert M.LABELS == ("healthy", "learning_rate/too_high", "learning_rate/too_low", "initialization/too_small",
                        "initialization/too_large", "data/corrupted", "data/shifted", "architecture/unstable",
                        "training_loop/stale_gradients", "training_loop/params_not_in_optimizer",
                        "training_loop/graph_detached", "training_loop/loss_on_probabilities",
                        "numerics/overflow", "numerics/updates_lost", "unexplained/not_learning")
    assert len(M.posterior_columns()) == 21  # every root state, ok included


def test_parse_post_column_handles_underscored_names():
    assert M.parse_post_column("post_learning_rate_too_high") == ("learning_rate", "too_high")
    assert M.parse_post_column("post_data_ok") == ("data", "ok")
    assert M.parse_post_column("post_optimizer_bad_beta") == ("optimizer", "bad_beta")
    assert M.parse_post_column("p_healthy") is None
    cols = M.posterior_columns() + ["post_data_leaked"]
    assert M.labels_from_columns(cols) == M.LABELS + ("data/leaked",)


def test_scores_prediction_rule_and_topk():
    # run 0: P(healthy)=0.1, lr too_high 0.8, init too_small 0.15 -> ranking lr, init, healthy
    # run 1: P(healthy)=0.7, data shifted 0.25                       -> healthy first
    df = _records([
        {"p_healthy": 0.1, "post_learning_rate_too_high": 0.8, "post_initialization_too_small": 0.15,
         "true_cause": "initialization", "true_state": "too_small"},
        {"p_healthy": 0.7, "post_data_shifted": 0.25, "true_cause": "", "true_state": ""},
    ])
    s = M.label_scores(df, M.LABELS).to_numpy()
    y = M.label_index(M.true_labels(df), M.LABELS)
    assert list(M.true_labels(df)) == ["initialization/too_small", "healthy"]
    assert list(M.topk_correct(s, y, 1)) == [False, True]
    assert list(M.topk_correct(s, y, 2)) == [True, True]
    assert M.accuracy(s, y, 1) == 0.5
    q = M.normalize(s)
    np.testing.assert_allclose(q[0, [0, 1, 3]], np.array([0.1, 0.8, 0.15]) / 1.05)
    np.testing.assert_allclose(q.sum(axis=1), 1.0)


def test_ties_go_to_label_order_and_zero_rows_predict_healthy():
    s = np.array([[0.0, 0.0, 0.0], [0.2, 0.5, 0.5]])
    assert list(M.ranking(s)[:, 0]) == [0, 1]
    np.testing.assert_allclose(M.normalize(s)[0], [1 / 3] * 3)


def test_label_index_names_valid_labels():
    with pytest.raises(ValueError, match="valid: healthy"):
        M.label_index(["nope"], M.LABELS)


def test_grouped_accuracy_per_arch_and_overall():
    s = np.array([[1, 0], [0, 1], [1, 0], [1, 0]], dtype=float)
    y = np.array([0, 0, 0, 1])
    t = M.grouped_accuracy(s, y, ["a", "a", "b", "b"], ks=(1,))
    assert t.loc["a", "top1"] == 0.5 and t.loc["b", "top1"] == 0.5
    assert t.loc["overall", "top1"] == 0.5 and t.loc["overall", "n"] == 4


def test_confusion_matrix_counts():
    cm = M.confusion_matrix(["healthy", "data/corrupted", "data/corrupted"],
                            ["healthy", "healthy", "data/corrupted"], ["healthy", "data/corrupted"])
    assert cm.to_numpy().tolist() == [[1, 0], [1, 1]]


def test_ece_hand_computed():
    # bins of 1/15: 0.9 -> bin 13, 0.6 -> bin 8 (edge 9/15 belongs to the bin below), 0.3 -> bin 4
    conf = np.array([0.9, 0.9, 0.6, 0.3])
    correct = np.array([1, 0, 1, 0])
    assert list(M.bin_index(conf)) == [13, 13, 8, 4]
    assert M.ece(conf, correct) == pytest.approx((0.8 + 0.4 + 0.3) / 4)
    assert M.ece(np.array([0.0, 1.0]), np.array([0, 1])) == 0.0


def test_brier_and_log_loss_hand_computed():
    p = np.array([[0.7, 0.2, 0.1], [0.7, 0.2, 0.1]])
    y = np.array([0, 1])
    assert M.brier(p, y) == pytest.approx((0.14 + 1.14) / 2)
    assert M.log_loss(p, y) == pytest.approx(-(math.log(0.7) + math.log(0.2)) / 2)
    assert M.log_loss(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(-math.log(M.LOG_LOSS_EPS))
    with pytest.raises(ValueError, match="distributions"):
        M.brier(np.array([[0.5, 0.6]]), np.array([0]))


def test_false_alarm_rate_and_exact_bound():
    fa = M.false_alarm_rate(np.zeros(150, dtype=bool))
    assert fa["rate"] == 0 and fa["upper"] == pytest.approx(1 - 0.05 ** (1 / 150))
    fa = M.false_alarm_rate(np.array([True, False, False, False]))
    assert fa["rate"] == 0.25 and fa["alarms"] == 1


def test_alarms_of_the_network_and_of_a_distribution():
    df = pd.DataFrame({"pred_cause": ["", "data", None, ""], "p_healthy": [0.9, 0.9, 0.4, 0.6]})
    assert list(M.bn_alarms(df)) == [False, True, True, False]
    p = np.array([[0.6, 0.4], [0.4, 0.6], [0.45, 0.1]])
    p[2, 1] = 0.55
    assert list(M.distribution_alarms(p)) == [False, True, True]


def test_localization_hand_computed():
    df = pd.DataFrame({
        "true_layer": ["fc1", "fc1", "", None],
        "origin_layer": ["fc1", "fc2", "fc3", ""],
        "true_onset": [30, 30, 0, None],
        "onset_step": [32, None, 4, 7],
    })
    loc = M.localization(df)
    assert loc["layer_n"] == 2 and loc["layer_acc"] == 0.5
    assert loc["onset_n"] == 2 and loc["onset_missing"] == 1
    assert loc["onset_mean_err"] == 3.0 and loc["onset_median_abs_err"] == 3.0
    assert list(M.onset_errors(df).fillna(-1)) == [2.0, -1, 4.0, -1]


def test_distribution_from_json_fills_and_normalizes():
    p = M.distribution_from_json(['{"healthy": 0.5, "data/corrupted": 0.5}', "", {"healthy": 2.0}],
                                 ["healthy", "data/corrupted"])
    np.testing.assert_allclose(p, [[0.5, 0.5], [0.5, 0.5], [1.0, 0.0]])


def _calibrated_sample(rng, n, k=6):
    probs = rng.dirichlet(np.ones(k) * 0.7, size=n)
    y = np.array([rng.choice(k, p=p) for p in probs])
    return probs, y


def test_calibrated_predictor_shows_biased_ece_but_sits_in_its_null_band():
    rng = np.random.default_rng(1)
    inside, eces = 0, []
    for rep in range(100):
        probs, y = _calibrated_sample(rng, 200)
        pred, conf = M.top_label(probs)
        e = M.ece(conf, pred == y)
        eces.append(e)
        inside += e <= M.ece_null_band(conf, draws=400, seed=rep)["hi"]
    # plug-in ECE of a perfect predictor is far from 0 at n = 200 ...
    assert 0.04 < np.mean(eces) < 0.12
    # ... yet the 97.5% upper end of the null covers it about 97.5% of the time
    assert inside >= 90


def test_miscalibrated_predictor_falls_outside_the_band():
    rng = np.random.default_rng(2)
    probs, y = _calibrated_sample(rng, 400)
    sharp = probs ** 4
    sharp /= sharp.sum(axis=1, keepdims=True)  # overconfident version of a calibrated model
    pred, conf = M.top_label(sharp)
    assert M.ece(conf, pred == y) > M.ece_null_band(conf, draws=500)["hi"]


def test_reliability_tables_line_up():
    conf = np.array([0.95, 0.95, 0.5])
    rt = M.reliability_table(conf, np.array([1, 1, 0]))
    assert rt["count"].sum() == 3 and rt.loc[14, "accuracy"] == 1.0 and rt.loc[7, "confidence"] == 0.5
    nb = M.reliability_null_band(conf, draws=200)
    assert np.isnan(nb.loc[0, "null_lo"]) and nb.loc[14, "null_lo"] <= nb.loc[14, "null_hi"]


probs_st = st.integers(1, 30).flatmap(lambda n: st.integers(2, 9).flatmap(lambda k: st.tuples(
    arrays(float, (n, k), elements=st.floats(0, 1)), arrays(int, n, elements=st.integers(0, k - 1)))))


@settings(max_examples=60, deadline=None)
@given(probs_st)
def test_score_bounds(case):
    raw, y = case
    p = M.normalize(raw)
    assert 0.0 <= M.brier(p, y) <= 2.0 + 1e-12
    assert 0.0 <= M.log_loss(p, y) <= -math.log(M.LOG_LOSS_EPS) + 1e-9
    pred, conf = M.top_label(p)
    e = M.ece(conf, pred == y)
    assert 0.0 <= e <= 1.0
    band = M.ece_null_band(conf, draws=50)
    assert 0.0 <= band["lo"] <= band["median"] <= band["hi"] <= 1.0
    accs = [M.accuracy(p, y, k) for k in range(1, p.shape[1] + 1)]
    assert accs == sorted(accs) and accs[-1] == 1.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=20))
def test_perfect_one_hot_scores_zero(ys):
    y = np.array(ys)
    p = np.eye(5)[y]
    assert M.brier(p, y) == 0.0
    assert M.log_loss(p, y) == pytest.approx(0.0, abs=1e-12)
    assert M.ece(np.ones(len(y)), np.ones(len(y))) == 0.0


def test_wilson_interval_against_hand_computed_values():
    # 5 of 10 at 95%: centre (5 + z^2/2) / (10 + z^2) = 0.5, half-width
    # z / (10 + z^2) * sqrt(5 * 5 / 10 + z^2 / 4) with z = 1.959964 -> 0.263407
    lo, hi = M.wilson_interval(5, 10)
    assert lo == pytest.approx(0.236593, abs=1e-6) and hi == pytest.approx(0.763407, abs=1e-6)
    # no alarm in 150 runs: the interval is [0, z^2 / (150 + z^2)] = [0, 3.841459 / 153.841459]
    assert M.wilson_interval(0, 150) == (0.0, pytest.approx(0.0249702, abs=1e-6))
    assert all(math.isnan(v) for v in M.wilson_interval(0, 0))
    with pytest.raises(ValueError):
        M.wilson_interval(3, 2)
    fa = M.false_alarm_rate(np.array([True, False, False, False]))
    assert (fa["wilson_lo"], fa["wilson_hi"]) == M.wilson_interval(1, 4)


def test_wilson_interval_ends_are_exact_at_zero_and_all():
    z2 = statistics.NormalDist().inv_cdf(0.975) ** 2
    lo, hi = M.wilson_interval(0, 7)
    assert lo == 0.0 and hi == pytest.approx(z2 / (7 + z2))  # no 1e-17 left from rounding
    lo, hi = M.wilson_interval(7, 7)
    assert hi == 1.0 and lo == pytest.approx(7 / (7 + z2))
