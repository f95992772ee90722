"""End to end on the ecosystem suite: two library models x two injections x one seed, through the harness."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub
pytest.importorskip("torch_geometric")

from benchmarks import harness as H  # noqa: E402
from benchmarks import metrics as M  # noqa: E402
from benchmarks.__main__ import main as cli  # noqa: E402

ARCHS = ["pyg_gcn", "torch_lstm"]
INJECTIONS = ["healthy", "lr_div1e4"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("eco")
    rc = cli(["run", "--suite", "ecosystem", "--arch", *ARCHS, "--injection", *INJECTIONS, "--seeds", "1",
              "--healthy-seeds", "1", "--steps", "60", "--workers", "0", "--out", str(out), "--no-progress"])
    assert rc == 0
    return out


def test_ecosystem_records_have_the_api_schema_and_the_suite(bench):
    df = pd.read_csv(bench / "records.csv", keep_default_na=False)
    assert len(df) == len(ARCHS) * len(INJECTIONS)
    assert set(H.API_COLUMNS) <= set(df.columns)
    assert (df["suite"] == "ecosystem").all()
    assert (df["error"] == "").all(), df.loc[df["error"] != "", ["key", "error"]].to_string()
    assert set(df["family"]) == {"gnn", "rnn"}
    for _, r in df.iterrows():
        assert r["key"] == f"ecosystem__{r['arch']}__{r['injection']}__{r['seed']}"
        for var, states in M.ROOT_STATES.items():
            assert sum(float(r[M.post_column(var, s)]) for s in states) == pytest.approx(1.0, abs=1e-6)
        assert (bench / r["session"]).exists()
        if r["injection"] == "healthy":
            assert r["true_cause"] == r["true_state"] == ""
        else:
            assert (r["true_cause"], r["true_state"]) == ("learning_rate", "too_low")
            assert int(r["true_onset"]) == 0
        json.loads(r["hypotheses"])
    assert (df["note"] == "").all()  # seed 0 trains in float32: nothing ran otherwise than written


def test_a_run_without_a_bf16_lstm_kernel_is_recorded_with_its_note(tmp_path, monkeypatch):
    """The probe forced to "missing": the bf16 run (seed 1) of the LSTM trains in float32 and its
    record says so; the float32 run (seed 0) has no note; neither failed."""
    from benchmarks.ecosystem import cpu

    monkeypatch.setattr(cpu, "bf16_lstm", lambda: False)
    rc = cli(["run", "--suite", "ecosystem", "--arch", "torch_lstm", "--injection", "healthy", "--healthy-seeds", "2",
              "--steps", "12", "--workers", "0", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    df = pd.read_csv(tmp_path / "records.csv", keep_default_na=False).set_index("seed")
    assert (df["error"] == "").all()
    assert df.loc[0, "note"] == "" and df.loc[1, "note"] == cpu.LSTM_FP32
