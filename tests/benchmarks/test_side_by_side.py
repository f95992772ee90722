"""The suites side-by-side headline, on synthetic records and runs (no training, no sessions).

Sessions are replaced by :class:`neuraldbg.fit.Run` objects handed to the module's
``load_runs``; the records are written the way the harness writes them.
"""
from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pandas as pd
import pytest

from benchmarks import metrics as M
from benchmarks import report as R
from benchmarks import side_by_side as S
from benchmarks.records import collect, empty_record, write_record
from neuraldbg.fit import Run, truth_of

#: evidence a run of each truth shows (``noisy``: a second, less telling pattern)
EVIDENCE = {
    ("", ""): {"exploding": "absent", "loss_pattern": "decreasing", "data_nan": "absent", "step_size": "normal"},
    ("learning_rate", "too_high"): {"exploding": "later", "loss_pattern": "divergence", "step_size": "large"},
    ("data", "corrupted"): {"data_nan": "inside_sudden", "loss_pattern": "nonfinite"},
}
NOISY = {("", ""): {"loss_pattern": "slow"}, ("learning_rate", "too_high"): {"loss_pattern": "spike"},
         ("data", "corrupted"): {"data_nan": "inside_after"}}
PLAN = [("healthy", ("", "")), ("healthy", ("", "")), ("healthy", ("", "")),
        ("lr_x100", ("learning_rate", "too_high")), ("data_nan", ("data", "corrupted"))]


def _make(out, suite, archs, seeds=2, noisy_seed=1, errored=(), no_session=()):
    """Write records for ``archs`` ({arch: family}) and return the Runs their sessions would give."""
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for arch, fam in archs.items():
        for i, (inj, truth) in enumerate(PLAN):
            for seed in range(seeds):
                key = f"{suite}__{arch}__{inj}__{seed}" + ("" if PLAN.index((inj, truth)) == i else f"_{i}")
                ev = dict(EVIDENCE[truth], **(NOISY[truth] if seed == noisy_seed else {}))
                rec = empty_record(key, suite, arch, inj, seed, 10)
                rec.update(family=fam, true_cause=truth[0], true_state=truth[1], p_healthy=0.9 if not truth[0] else 0.1)
                for var, states in M.ROOT_STATES.items():
                    for st in states:
                        hit = (var, st) == truth
                        rec[M.post_column(var, st)] = 0.85 if hit else (0.0 if st != "ok" else (0.15 if var == truth[0]
                                                                                                 else 1.0))
                rec["pred_cause"], rec["pred_state"] = (truth if truth[0] else (None, None))
                lab = M.label_of(*truth)
                rec["baseline_first_event"] = json.dumps({lab: 0.7, M.HEALTHY: 0.3} if truth[0] else {M.HEALTHY: 1.0})
                rec["baseline_threshold_rules"] = json.dumps({M.HEALTHY: 1.0})
                rec["seconds"] = 1.0
                if key in errored:
                    rec["error"] = "RuntimeError: boom"
                write_record(out, rec)
                if key not in errored and key not in no_session:
                    runs.append((key, Run(key=key, family=fam, truth=truth_of(*truth), evidence=ev, arch=arch,
                                          injection=inj, seed=seed)))
    collect(out)
    return [r for _, r in runs]


ZOO = {"toy_a": "mlp", "toy_b": "mlp", "toy_c": "cnn"}
ECO = {"hf_x": "transformer"}


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    by_dir = {}
    zoo, eco = tmp_path / "zoo", tmp_path / "eco"
    by_dir[str(zoo)] = _make(zoo, "zoo", ZOO)
    by_dir[str(eco)] = _make(eco, "ecosystem", ECO, errored={"ecosystem__hf_x__healthy__0"},
                             no_session={"ecosystem__hf_x__lr_x100__0"})
    monkeypatch.setattr(S, "load_runs", lambda d: list(by_dir[str(d)]))
    return zoo, eco, by_dir


def test_score_row_hand_checkable_numbers():
    labels = len(M.LABELS)
    probs = np.full((4, labels), 0.0)
    probs[0, 0] = probs[1, 0] = 0.95          # healthy, confident: right, then wrong
    probs[2, 1] = probs[3, 0] = 0.6           # unconfident
    probs = M.normalize(np.where(probs == 0, (1 - probs.max(axis=1, keepdims=True)) / (labels - 1), probs))
    y = np.array([0, 2, 1, 0])
    row = S.score_row(probs, y, alarms=np.zeros(4, bool), healthy=y == 0, null_draws=50)
    assert row["n"] == 4 and row["confident_n"] == 2 and row["confident_acc"] == 0.5
    assert row["top1"] == 0.75
    z2 = statistics.NormalDist().inv_cdf(0.975) ** 2
    assert (row["false_alarms"], row["healthy_n"]) == (0, 2)
    assert row["false_alarm_lo"] == 0.0 and row["false_alarm_hi"] == pytest.approx(z2 / (2 + z2))


def test_side_by_side_table_counts_and_skips(dirs):
    zoo, eco, _ = dirs
    res = S.compare([zoo, eco], null_draws=50)
    t = res["table"]
    assert list(t.columns) == list(S.COLUMNS)
    assert t.loc["n", "zoo_loao"] == 30 and t.loc["n", "zoo_kfold"] == 30
    # one errored run and one without a session: 8 of 10 ecosystem runs scored
    assert res["counts"]["ecosystem"] == {"records": 10, "errored": 1, "no_session": 1, "scored": 8}
    assert t.loc["n", "eco_hand_set"] == t.loc["n", "eco_zoo_fitted"] == 8
    # the zoo-fitted column re-scores the sessions with the shipped priors (not the recorded
    # posteriors, which a refit makes stale); the baselines come from the records
    runs = S.gather([zoo, eco])["runs"]["ecosystem"]
    y, _ = S._labels(runs)
    assert t.loc["top1", "eco_zoo_fitted"] == pytest.approx(M.accuracy(S.rescore(runs, None, True).label_probs, y))
    assert t.loc["first_event_top1", "eco_zoo_fitted"] == 1.0
    assert t.loc["threshold_rules_top1", "eco_zoo_fitted"] == pytest.approx(5 / 8)
    assert res["temperature"] in res["temperature_loss"]
    md = S.render(res)
    assert "## Suites side by side" in md and "8 of 10 runs scored (1 errored, 1 without a usable session)" in md


def test_temperature_is_chosen_on_the_zoo_only(dirs, tmp_path, monkeypatch):
    zoo, eco, by_dir = dirs
    first = S.compare([zoo, eco], null_draws=20)
    # other ecosystem runs, other evidence: the ecosystem scores change, the temperature does not
    eco2 = tmp_path / "eco2"
    by_dir[str(eco2)] = [Run(r.key, r.family, r.truth, {"loss_pattern": "flat"}, r.arch, r.injection, r.seed)
                         for r in _make(eco2, "ecosystem", {"hf_y": "transformer"}, seeds=3)]
    second = S.compare([zoo, eco2], null_draws=20)
    assert second["temperature"] == first["temperature"]
    assert second["temperature_loss"] == first["temperature_loss"]
    assert second["table"].loc["n", "eco_hand_set"] != first["table"].loc["n", "eco_hand_set"]
    # the tempered ecosystem rows use that temperature, and only the zoo's
    assert any(f"T = {first['temperature']:.2f} (zoo LOAO)" in k for k in second["calibration"].index)


def test_missing_suite_gives_n_zero_columns(dirs):
    zoo, eco, _ = dirs
    only_zoo = S.compare([zoo], null_draws=20)
    assert only_zoo["table"].loc["n", "eco_hand_set"] == 0 and only_zoo["table"].loc["n", "eco_zoo_fitted"] == 0
    assert math.isnan(only_zoo["table"].loc["top1", "eco_hand_set"])
    only_eco = S.compare([eco], null_draws=20)
    assert only_eco["temperature"] is None and only_eco["table"].loc["n", "zoo_kfold"] == 0
    assert "n/a" in S.render(only_eco) and "No zoo runs" in S.render(only_eco)


def test_report_with_two_folders_writes_headline_tables_and_plots(dirs, capsys):
    zoo, eco, _ = dirs
    from benchmarks.__main__ import main as cli

    assert cli(["report", str(zoo), str(eco), "--null-draws", "50"]) == 0
    text = (zoo / "REPORT.md").read_text()
    assert text.index("## Suites side by side") < text.index("## Zoo suite") < text.index("## Ecosystem suite")
    assert "### Goals" in text and "reliability_zoo.png" in text and "Calibration on a new suite" in text
    csv = pd.read_csv(zoo / "suites.csv")
    assert list(csv["key"]) == list(S.COLUMNS) and list(csv["n"]) == [30, 30, 8, 8]
    doc = json.loads((zoo / "suites.json").read_text())
    assert doc["temperature"] is not None and doc["counts"]["zoo"]["scored"] == 30
    for png in ("reliability_zoo.png", "reliability_ecosystem.png", "reliability.png", "ecosystem_reliability.png"):
        assert (zoo / png).stat().st_size > 1000


def test_suites_sharing_one_folder(tmp_path, monkeypatch):
    both = tmp_path / "both"
    runs = _make(both, "zoo", ZOO) + _make(both, "ecosystem", ECO)
    monkeypatch.setattr(S, "load_runs", lambda d: list(runs))
    res = S.compare([both], null_draws=20)
    assert res["table"].loc["n", "zoo_loao"] == 30 and res["table"].loc["n", "eco_hand_set"] == 10
    R.write_report(both, null_draws=20, plots=False)
    assert "## Ecosystem suite" in (both / "REPORT.md").read_text()
