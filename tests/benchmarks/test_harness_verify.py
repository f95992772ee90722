"""``run --verify`` on real zoo runs: the record's verification columns, the scores before and
after, the report section, and a likelihood fit from the records."""
from __future__ import annotations

import argparse
import json
import math

import pytest

from benchmarks import harness, verification
from benchmarks.evaluation import evaluate
from benchmarks.records import VERIFY_COLUMNS, collect
from benchmarks.suites import RunSpec
from neuraldbg.verify import likelihoods as L
from neuraldbg.vocab import ROOTS


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    for inj, seed in [("lr_too_high", 0), ("healthy", 0), ("healthy", 1)]:
        spec = RunSpec("mlp", inj, seed, steps=40, time_bare=False, verify_steps=10, verify_top=2)
        rec = harness.run_one(spec, out)
        assert rec["error"] == "" and rec["verify_error"] == "", rec.get("traceback")
    return out, collect(out)


def test_records_carry_the_verification(verified):
    _, df = verified
    assert set(VERIFY_COLUMNS) <= set(df.columns)
    lr = df[df["injection"] == "lr_too_high"].iloc[0]
    assert (lr["verified_pred_cause"], lr["verified_pred_state"]) == ("learning_rate", "too_high")
    tests = json.loads(lr["verify_tests"])
    assert tests[0]["cause"] == "learning_rate" and tests[0]["outcome"] == "vanished"
    assert 0 < int(lr["verify_extra_steps"]) <= 20 and int(lr["snapshot_bytes"]) > 0
    assert len(json.loads(lr["verify_joint_before"])) == math.prod(len(s) for s in ROOTS.values())


def test_scores_before_and_after_and_report_section(verified):
    _, df = verified
    res = evaluate(df, null_draws=50)
    v = res["verification"]
    assert v["n"] == 3 and v["per_arch"].loc["overall", "top1_after"] == 1.0
    assert int(v["false_alarms"].loc["after", "new_alarms"]) == 0
    # recomputed offline from the stored joint and outcomes, it equals what the run reported
    after = verification.after_scores(df, lambda i: L.table_for("mlp"))
    assert after[:, 0] == pytest.approx(df["verified_p_healthy"].astype(float).to_numpy(), abs=1e-9)
    text = verification.render(v)
    assert "Verification by replay (zoo)" in text and "top1_after_cv" in text
    goals = res["goals"].set_index("goal")
    assert goals.loc["median extra steps per run <= 60", "verdict"] == "PASS"


def test_fit_from_the_records(verified, tmp_path, capsys):
    from neuraldbg import cli

    out, _ = verified
    assert cli.main(["tune-verification", "--runs", str(out), "--out", str(tmp_path / "v.json")]) == 0
    assert "tests from 1 folder(s)" in capsys.readouterr().out
    data = json.loads((tmp_path / "v.json").read_text())
    assert cli.main(["tune-verification", "--runs", str(tmp_path)]) == 1  # no records there
    assert capsys.readouterr().err.startswith("neuraldbg: error: no records in ")
    assert data["provenance"]["tests"] > 0 and set(data["fitted"]) == {"default", "mlp"}
    k, n = data["counts"]["mlp"]["learning_rate/too_high|learning_rate/too_high"]
    assert (k, n) == (1, 1)
    row = data["fitted"]["mlp"]["learning_rate/too_high"]
    hand = L.load()["hand_set"]["learning_rate/too_high"]["learning_rate/too_high"]
    assert row["learning_rate/too_high"] > hand - 1e-9


def test_verify_flag_validates_budgets():
    p = argparse.ArgumentParser()
    harness.add_arguments(p)
    args = p.parse_args(["--verify", "--verify-steps", "0", "--arch", "mlp", "--quick"])
    with pytest.raises(ValueError, match="--verify-steps must be >= 1"):
        harness._with_verify(harness._plan_from_args(args), args)
    args = p.parse_args(["--verify", "--arch", "mlp", "--quick"])
    specs = harness._with_verify(harness._plan_from_args(args), args)
    assert {(s.verify_steps, s.verify_top) for s in specs} == {(20, 3)}
