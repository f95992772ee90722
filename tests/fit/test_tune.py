"""Prior tuning: EM recovers known tables, unseen configurations keep the prior,
the written file round-trips and loads in NeuralDbg, bad files fail clearly, the CLI works."""
import json
import math

import numpy as np
import pytest

import neuraldbg.fit as T
from neuraldbg import cli
from neuraldbg.causal.calibration import sample
from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.cpd import Cpd, build_cpds
from neuraldbg.causal.priors import PriorError, load_priors, read
from neuraldbg.causal.structure import ROOT_NAMES, ROOTS, default_network
from neuraldbg.fit.em import fitted_nodes
from tests.fit.runs import runs_dir

NET = default_network()

#: root priors that put every abnormal state in reach of a few thousand samples
WIDE = {"learning_rate": {"ok": .5, "too_high": .25, "too_low": .25},
        "initialization": {"ok": .5, "too_small": .25, "too_large": .25},
        "data": {"ok": .5, "corrupted": .25, "shifted": .25}, "architecture": {"ok": .5, "unstable": .5},
        # the loop and leak roots rarely abnormal: the root configurations of the four above keep
        # enough samples each for the sampling-error bounds below
        "training_loop": {"ok": .96, "stale_gradients": .01, "params_not_in_optimizer": .01, "graph_detached": .01,
                          "loss_on_probabilities": .01},
        "numerics": {"ok": .98, "overflow": .01, "updates_lost": .01},
        "unexplained": {"ok": .98, "not_learning": .02}}


def _replace(cpds, name, values):
    c = cpds[name]
    return {**cpds, name: Cpd(name, c.states, c.parents, np.asarray(values, dtype=float).reshape(c.values.shape))}


def _runs(cpds, n, seed, family="mlp"):
    truth, codes = sample(cpds, NET, n, seed=seed)
    return [T.Run(key=str(i), family=family, seed=i % 5,
                  truth={r: ROOTS[r][truth[r][i]] for r in ROOT_NAMES},
                  evidence={e: NET.states_of(e)[codes[i, j]] for j, e in enumerate(NET.evidence_names)})
            for i in range(len(codes))]


def test_fit_recovers_known_cpds_within_sampling_error():
    base = build_cpds(WIDE, load_priors("mlp").cpds, NET)
    # the "true" world differs from the hand-set tables in an observed-parent table
    # (depth_risk) and in one hanging off a latent (loss_start: leak and the init effect)
    true = _replace(base, "depth_risk", [[0.80, 0.25], [0.15, 0.45], [0.05, 0.30]])
    ls = true["loss_start"].values.copy()
    ls[1] = np.where(ls[1] > 0.3, 0.35, 0.12)  # P(high): leak 0.04 -> 0.12, init 0.6 -> 0.35
    ls[0] = 1 - ls[1]
    true = _replace(true, "loss_start", ls)
    runs = _runs(true, 4000, seed=7)
    fitted, info = T.fit_cpds(runs, base, ess=5, engine="numpy")
    assert info.converged and info.log_likelihood > info.log_likelihood_start

    arch = np.array([r.truth["architecture"] == "unstable" for r in runs])
    for j, n in enumerate((int((~arch).sum()), int(arch.sum()))):
        p, q = true["depth_risk"].values_2d[:, j], fitted["depth_risk"].values_2d[:, j]
        assert np.all(np.abs(p - q) < 4 * np.sqrt(p * (1 - p) / n) + 5 / n)
    # a latent-parent table: compare P(loss_start | roots), latents summed out (the
    # identifiable quantity), on every single-fault or healthy root configuration
    got, want = CompiledNetwork(fitted, NET).root_likelihood, CompiledNetwork(true, NET).root_likelihood
    net = CompiledNetwork(true, NET)
    counts = np.bincount([net.root_joint_index(r.truth) for r in runs], minlength=net.n_root_joint)
    for r in range(net.n_root_joint):
        if counts[r] < 150:
            continue
        pw = want["loss_start"][r] / want["loss_start"][r].sum()
        pg = got["loss_start"][r] / got["loss_start"][r].sum()
        assert abs(pw[1] - pg[1]) < 4 * math.sqrt(pw[1] * (1 - pw[1]) / counts[r]) + 0.01, r
    # and the fit moved the hand-set table toward the truth
    hand = CompiledNetwork(base, NET).root_likelihood["loss_start"]
    rs = counts >= 150
    target = want["loss_start"][rs, 1] / want["loss_start"][rs].sum(1)
    err_fit = np.abs(got["loss_start"][rs, 1] / got["loss_start"][rs].sum(1) - target)
    err_hand = np.abs(hand[rs, 1] / hand[rs].sum(1) - target)
    assert err_fit.mean() < 0.3 * err_hand.mean()


def test_pgmpy_and_numpy_m_steps_agree():
    base = build_cpds(WIDE, load_priors("mlp").cpds, NET)
    runs = _runs(base, 300, seed=2)
    runs[0] = T.Run(key="partial", family="mlp", truth=runs[0].truth,
                    evidence={**runs[0].evidence, "loss_pattern": ("decreasing", "slow", "flat")})
    a, ia = T.fit_cpds(runs, base, ess=3, max_iter=4, engine="numpy")
    b, ib = T.fit_cpds(runs, base, ess=3, max_iter=4, engine="pgmpy")
    assert ia.iterations == ib.iterations
    for name in fitted_nodes(NET):
        np.testing.assert_allclose(a[name].values, b[name].values, atol=1e-12, err_msg=name)


def test_unseen_parent_configurations_keep_their_prior_columns():
    pri = load_priors("mlp")
    base = build_cpds(pri.roots, pri.cpds, NET)
    # only healthy and lr-too-high runs: no unstable architecture, never two faults at once
    roots = {v: {s: (1.0 if s == "ok" else 0.0) for s in ss} for v, ss in ROOTS.items()}
    roots["learning_rate"] = {"ok": 0.5, "too_high": 0.5, "too_low": 0.0}
    runs = _runs(build_cpds(roots, pri.cpds, NET), 400, seed=3)
    fitted, _ = T.fit_cpds(runs, pri, ess=10, engine="numpy")
    for c in fitted.values():
        assert np.all(np.isfinite(c.values)) and np.allclose(c.values_2d.sum(0), 1, atol=1e-12)
    np.testing.assert_allclose(fitted["depth_risk"].values[:, 1], base["depth_risk"].values[:, 1], rtol=0, atol=1e-15)
    # parents architecture, corruption, data, initialization, learning_rate, training_loop
    assert fitted["instability"].parents[:5] == ("architecture", "corruption", "data", "initialization",
                                                 "learning_rate")
    inst, ref = fitted["instability"].values, base["instability"].values
    # (unstable, none, shifted, ok, ok) and (ok, values, corrupted, too_large, too_low) were never seen
    np.testing.assert_allclose(inst[:, 1, 0, 2, 0, 0], ref[:, 1, 0, 2, 0, 0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(inst[:, 0, 1, 1, 2, 2], ref[:, 0, 1, 1, 2, 2], rtol=0, atol=1e-15)
    # the configurations that were seen did move
    assert not np.allclose(inst[:, 0, 0, 0, 0, 1], ref[:, 0, 0, 0, 0, 1], atol=1e-4)


# ------------------------------------------------------------------ files and loading

def test_load_runs_reads_sessions_and_skips_errored_records(tmp_path):
    runs = T.load_runs(runs_dir(tmp_path, families=("mlp", "cnn")), family="mlp")
    assert len(runs) == 6 and {r.label for r in runs} == {"healthy", "data/corrupted"}
    nan = next(r for r in runs if r.injection == "data_nan")
    assert nan.evidence["data_nan"] == "input" and nan.truth == {**{v: "ok" for v in ROOTS}, "data": "corrupted"}
    # what each run lacks the preconditions of, read as the online diagnosis reads it
    healthy = next(r for r in runs if r.injection == "healthy")
    assert ("data", "corrupted") in healthy.ruled_out and ("data", "corrupted") not in nan.ruled_out
    assert ("numerics", "overflow") in nan.ruled_out  # the NaN came with the input


def test_runs_recorded_by_other_code_are_refused_unless_allowed(tmp_path, caplog):
    """Regression: priors were fitted to a folder resumed across a change of the monitor, whose
    sessions held the events the old code recorded."""
    from neuraldbg.source import code_version

    d = runs_dir(tmp_path, seeds=2, code="0123456789ab")  # digits only: read as text, zeros kept
    assert {r.code for r in T.load_runs(d)} == {"0123456789ab"}
    with pytest.raises(T.TuneError, match=r"4 of 4 mlp runs .* other code \(0123456789ab\).*--allow-stale"):
        T.tune(d, "mlp", ess=4, folds=0, max_iter=2, engine="numpy")
    res = T.tune(d, "mlp", ess=4, folds=0, max_iter=2, engine="numpy", allow_stale=True)
    fo = res.data["provenance"]["fitted_on"]
    assert fo["code"] == code_version() and fo["recorded_by"] == ["0123456789ab"]
    out = tmp_path / "p.json"
    args = ["tune-priors", "--family", "mlp", "--runs", str(d), "--out", str(out), "--folds", "0"]
    assert cli.main(args) == 1 and not out.exists()
    assert cli.main(args + ["--allow-stale"]) == 0 and out.exists()
    unsaid = runs_dir(tmp_path / "old", seeds=2, code="")  # a folder from before records said
    with caplog.at_level("WARNING", logger="neuraldbg"):
        T.tune(unsaid, "mlp", ess=4, folds=0, max_iter=2, engine="numpy")
    assert "do not say which code recorded them" in caplog.text


def test_refitting_a_refit_records_its_base_once(tmp_path):
    """Regression: every refit nested the base's provenance once more ("mlp.json (hand-set base
    recorded in mlp.json) (hand-set base recorded in mlp.json) ...")."""
    d = runs_dir(tmp_path, seeds=2)
    first = T.tune(d, "mlp", ess=4, folds=0, max_iter=2, engine="numpy")
    again = T.tune(d, "mlp", ess=4, folds=0, max_iter=2, engine="numpy", base=first.priors)
    for res in (first, again):
        assert res.data["provenance"]["base"]["source"] == "mlp.json"
        assert "hand-set base recorded" not in res.data["description"] + res.data["reasoning"]["cpds"]


def test_tuned_file_round_trips_and_loads_in_neuraldbg(tmp_path):
    import torch

    from neuraldbg import NeuralDbg

    d = runs_dir(tmp_path, seeds=4)
    res = T.tune(d, "mlp", ess=4, folds=2, max_iter=5)   # pgmpy M-step, the shipped path
    path = res.write(tmp_path / "mlp_tuned.json")
    pri = read(path)
    assert pri.family == "mlp" and pri.fingerprint == res.priors.fingerprint
    assert load_priors(path=path).cpds == res.priors.cpds and set(pri.cpds) == set(fitted_nodes(NET))
    assert pri.roots == load_priors("mlp").roots                     # root priors are kept
    prov = pri.provenance
    assert prov["method"] == "fitted" and prov["fitted_on"]["records"] == 8
    assert prov["fitted_on"]["seeds"] == [0, 1, 2, 3] and prov["fitted_on"]["architectures"] == ["mlp"]
    assert len(prov["fitted_on"]["sha256"]) == 64 and prov["estimator"]["ess"] == 4
    assert "DiscreteBayesianEstimator" in prov["estimator"]["m_step"] and prov["pgmpy_version"]
    for k in ("hand_set", "fitted", "fitted_tempered"):
        assert set(prov["heldout"][k]) >= {"log_loss", "brier", "ece", "top1"}
    assert pri.temperature in T.TEMPERATURE_GRID
    # re-tuning the fitted file shrinks toward the recorded hand-set base, not toward itself
    again = T.hand_set_base(pri)
    assert again.cpds == T.hand_set_base(load_priors("mlp")).cpds and again.temperature == 1.0
    # the fitted network learned that a NaN at the input means corrupted data
    nan_ev = {"data_nan": "input", "loss_pattern": "nonfinite"}
    assert CompiledNetwork(build_cpds(pri.roots, pri.cpds, NET), NET).posterior(nan_ev)[0]["data"]["corrupted"] > 0.9

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, family="mlp", priors=path) as dbg:
        for _ in range(25):
            x = torch.randn(16, 4)
            loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    post = dbg.posterior()
    assert post.source == str(path) or post.source.endswith("mlp_tuned.json")
    assert all(math.isclose(sum(post[v].values()), 1.0, abs_tol=1e-9) for v in ROOTS)


def test_malformed_tuned_file_fails_clearly(tmp_path):
    runs = _runs(build_cpds(WIDE, load_priors("mlp").cpds, NET), 200, seed=5)
    doc = T.tune(runs, "mlp", folds=0, max_iter=3, engine="numpy").data
    assert doc["provenance"]["heldout"] is None and doc["temperature"] == 1.0

    def bad(mutate, match):
        d = json.loads(json.dumps(doc))
        mutate(d)
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(d))
        with pytest.raises(PriorError, match=match):
            read(p)

    bad(lambda d: d.update(schema_version=3), "schema_version 3 is not supported")
    bad(lambda d: d["cpds"]["exploding"]["values"].pop(), r"cpds.exploding: values must be a 3 x 27 ")
    bad(lambda d: d["cpds"]["exploding"].update(parents=["instability", "corruption"]),
        r"must be \['corruption', 'instability', 'numerics'\]")
    bad(lambda d: d["cpds"]["dead"]["values"][0].__setitem__(0, 0.9), r"cpds.dead: column 0 sums to")
    bad(lambda d: d["cpds"].update(mystery={"values": [[1.0]]}), "no such non-root node")
    trunc = tmp_path / "trunc.json"
    trunc.write_text(json.dumps(doc)[:500])
    with pytest.raises(PriorError, match="not valid JSON"):
        read(trunc)


def test_tune_errors_name_what_is_valid(tmp_path):
    runs = _runs(build_cpds(WIDE, load_priors("mlp").cpds, NET), 20, seed=1)
    with pytest.raises(T.TuneError, match="unknown family 'vit'; valid: mlp"):
        T.tune(runs, "vit")
    with pytest.raises(T.TuneError, match="no runs of family 'gnn'.*families present: mlp"):
        T.tune(runs, "gnn")
    with pytest.raises(T.TuneError, match="ess must be > 0"):
        T.fit_cpds(runs, load_priors("mlp"), ess=0)
    with pytest.raises(T.TuneError, match="evidence loss_pattern='wobbly' names no state"):
        T.fit_cpds([T.Run("x", "mlp", {v: "ok" for v in ROOTS}, {"loss_pattern": "wobbly"})], load_priors("mlp"))
    with pytest.raises(T.TuneError, match="no records.csv"):
        T.load_runs(tmp_path)


def test_cross_validation_groups_by_seed_and_picks_a_temperature():
    runs = _runs(build_cpds(WIDE, load_priors("mlp").cpds, NET), 300, seed=11)
    cv = T.cross_validate(runs, load_priors("mlp"), ess=10, folds=5)
    assert cv.grouping == "seed" and set(cv.folds.tolist()) == set(range(5))
    for s in range(5):   # every run of a seed is in one fold
        assert len({f for f, r in zip(cv.folds, runs) if r.seed == s}) == 1
    m = cv.metrics()
    assert cv.temperature in T.TEMPERATURE_GRID
    assert cv.criterion == "prior_mix"
    assert m["fitted_tempered"]["mix_log_loss"] <= m["fitted"]["mix_log_loss"] + 1e-12
    bench = T.cross_validate(runs, load_priors("mlp"), ess=10, folds=5, criterion="benchmark").metrics()
    assert bench["fitted_tempered"]["log_loss"] <= bench["fitted"]["log_loss"] + 1e-12
    assert 0 <= m["hand_set"]["ece"] <= 1 and 0 <= m["fitted"]["top1"] <= 1
    one_seed = [T.Run(r.key, r.family, r.truth, r.evidence, seed=0) for r in runs[:50]]
    assert T.fold_groups(one_seed, 5)[1] == "run"


def test_cli_tune_priors(tmp_path, capsys):
    d = runs_dir(tmp_path, seeds=3)
    out = tmp_path / "fit" / "mlp.json"
    assert cli.main(["tune-priors", "--family", "mlp", "--runs", str(d), "--out", str(out),
                     "--ess", "5", "--folds", "3"]) == 0
    text = capsys.readouterr().out
    assert "Fitted mlp on 6 runs" in text and "hand_set" in text and f"Wrote {out}" in text
    pri = load_priors(path=out)
    assert pri.provenance["estimator"]["ess"] == 5 and pri.provenance["heldout"]["folds"] == 3
    assert cli.main(["tune-priors", "--family", "gnn", "--runs", str(d), "--out", str(out)]) == 1
    assert "no runs of family 'gnn'" in capsys.readouterr().err
    assert cli.main(["tune-priors", "--family", "vit", "--runs", str(d), "--out", str(out)]) == 1
    assert cli.main(["tune-priors", "--family", "mlp", "--runs", str(tmp_path / "none"), "--out", str(out)]) == 1
    assert "runs directory not found" in capsys.readouterr().err


def test_prior_mix_weights_reproduce_the_label_mix_of_the_root_priors():
    pri = load_priors("gnn")
    runs = _runs(build_cpds(WIDE, pri.cpds, NET), 2000, seed=4)
    w = T.prior_mix_weights(runs, pri)
    labelled = [r.label is not None for r in runs]
    assert np.all(w[~np.array(labelled)] == 0) and math.isclose(w.sum(), sum(labelled))
    ok = {v: pri.roots[v]["ok"] for v in ROOTS}
    p_healthy = math.prod(ok.values())
    p_high = pri.roots["learning_rate"]["too_high"] * math.prod(o for v, o in ok.items() if v != "learning_rate")
    share = {lab: w[[r.label == lab for r in runs]].sum() for lab in ("healthy", "learning_rate/too_high")}
    assert share["healthy"] / share["learning_rate/too_high"] == pytest.approx(p_healthy / p_high)


def test_priors_eval_kfold_and_leave_one_arch_out(tmp_path):
    from benchmarks import priors_eval

    runs = _runs(build_cpds(WIDE, load_priors("mlp").cpds, NET), 300, seed=9)
    runs = [T.Run(r.key, "mlp" if i % 3 else "cnn", r.truth, r.evidence, arch=("a", "b", "c")[i % 3], seed=r.seed)
            for i, r in enumerate(runs)]
    res = priors_eval.evaluate(tmp_path, folds=3, ess=10, runs=runs)
    kf, loao = res["kfold"], res["loao"]
    assert list(kf.index) == ["cnn", "mlp", "all"] and (kf["grouping"] == "seed").all()
    assert {"hand_set_log_loss", "fitted_top1", "fitted_tempered_ece", "fitted_dtop1"} <= set(kf.columns)
    assert list(loao.index) == ["a", "b", "c"] and loao["gap_log_loss"].notna().all()
    # pooled scores equal the benchmark's metrics on the stacked held-out predictions
    assert kf.loc["all", "n"] == sum(r.label is not None for r in runs)
    text = priors_eval.render(res, tmp_path)
    assert "## K-fold by seed, per family" in text and "## Leave one architecture out" in text


def test_regression_refitting_a_fitted_file_keeps_the_root_reasoning():
    """Bug: hand_set_base rebuilt the base from provenance.base, which records only the tables'
    reasoning, so every `make priors` after the first dropped the roots' reasoning."""
    pri = load_priors("mlp")
    assert pri.provenance.get("method") == "fitted"
    base = T.hand_set_base(pri)
    for var in pri.roots:
        assert base.reasoning.get(var) == pri.reasoning.get(var) and base.reasoning[var]
