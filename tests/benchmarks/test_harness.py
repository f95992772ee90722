"""End to end: the real zoo, monitor and causal engine, two architectures x two injections x one seed."""
from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest

import models
import neuraldbg.causal.api  # noqa: F401  (a broken engine must fail here, not skip)
from benchmarks import harness as H
from benchmarks import metrics as M
from benchmarks.__main__ import main as cli

ARCHS = ["mlp", "cnn"]
INJECTIONS = ["healthy", "data_nan"]

HAS_PARQUET = importlib.util.find_spec("pyarrow") is not None


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert set(ARCHS) <= set(models.architectures())
    rc = cli(["run", "--arch", *ARCHS, "--injection", *INJECTIONS, "--seeds", "1", "--healthy-seeds", "1",
              "--workers", "2", "--out", str(out), "--no-progress"])
    assert rc == 0
    return out


def test_records_have_the_api_schema(bench):
    df = pd.read_csv(bench / "records.csv", keep_default_na=False)
    assert len(df) == len(ARCHS) * len(INJECTIONS)
    assert set(H.API_COLUMNS) <= set(df.columns)
    assert (df["error"] == "").all(), df.loc[df["error"] != "", ["key", "error"]].to_string()
    for _, r in df.iterrows():
        for var, states in M.ROOT_STATES.items():
            assert sum(float(r[M.post_column(var, s)]) for s in states) == pytest.approx(1.0, abs=1e-6)
        assert 0.0 <= float(r["p_healthy"]) <= 1.0
        assert float(r["seconds"]) > 0
        if r["injection"] == "healthy":  # the timing twin is trained for healthy runs
            assert float(r["seconds_bare"]) > 0
        assert (bench / r["session"]).exists()
        hyps = json.loads(r["hypotheses"])
        probs = [h["probability"] for h in hyps]
        assert probs == sorted(probs, reverse=True)
        if r["injection"] == "healthy":
            assert r["true_cause"] == r["true_state"] == ""
        else:
            assert (r["true_cause"], r["true_state"]) == ("data", "corrupted")
            assert r["true_layer"] != "" and r["true_onset"] != ""
    # parquet is written exactly when a parquet engine is installed (docs/api.md: "when available")
    assert (bench / "records.parquet").exists() == HAS_PARQUET


def test_resume_skips_finished_runs_and_report_reads_them(bench):
    mtimes = {p: p.stat().st_mtime_ns for p in (bench / "records").glob("*.json")}
    assert cli(["run", "--arch", *ARCHS, "--injection", *INJECTIONS, "--seeds", "1", "--healthy-seeds", "1",
                "--workers", "0", "--out", str(bench), "--no-progress"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (bench / "records").glob("*.json")} == mtimes
    assert cli(["report", str(bench), "--null-draws", "200"]) == 0
    assert "## Goals" in (bench / "REPORT.md").read_text()
