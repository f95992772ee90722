"""Harness planning, records and resume with a stand-in zoo (no training)."""
from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest

from benchmarks import harness as H
from benchmarks.__main__ import main as cli


def test_plan_sizes_and_timing_twins(fake_zoo):
    specs = H.plan(fake_zoo, archs=["toy_a"], seeds=2)
    count = pd.Series([s.injection for s in specs]).value_counts()
    assert count["lr_too_high"] == 2 and count["healthy"] == H.HEALTHY_PER_SEED * 2
    assert all(s.time_bare == (s.injection == "healthy") for s in specs)
    specs = H.plan(fake_zoo, injections=["healthy", "data_nan"], seeds=1, healthy_seeds=3, bare_seeds=1)
    assert len(specs) == 2 * (3 + 1)
    assert [s.time_bare for s in specs if s.arch == "toy_a"] == [True, False, False, False]
    specs = H.plan(fake_zoo, archs=["toy_b"], seeds=1, bare_injected=True)
    assert all(s.time_bare for s in specs)


def test_plan_names_valid_values(fake_zoo):
    with pytest.raises(ValueError, match="valid: toy_a, toy_b"):
        H.plan(fake_zoo, archs=["nope"])
    with pytest.raises(ValueError, match="valid: broken, data_nan, healthy, lr_too_high"):
        H.plan(fake_zoo, injections=["nope"])
    with pytest.raises(ValueError, match="seeds"):
        H.plan(fake_zoo, seeds=0)


def test_run_one_record_schema_session_and_baselines(fake_zoo, tmp_path):
    rec = H.run_one(H.RunSpec("toy_a", "data_nan", 1, time_bare=True), tmp_path)
    assert set(H.RECORD_COLUMNS) <= set(rec)
    assert rec["error"] == ""
    truth = (rec["true_cause"], rec["true_state"], rec["true_layer"], rec["true_onset"])
    assert truth == ("data", "corrupted", "fc1", 30)
    assert (rec["pred_cause"], rec["pred_state"], rec["origin_layer"]) == ("data", "corrupted", "fc1")
    assert rec["events_nan"] == 1 and rec["n_events"] == 1 and rec["first_event_kind"] == "nan"
    assert rec["seconds"] > rec["seconds_bare"] > 0
    assert (tmp_path / "sessions" / "toy_a__data_nan__1.json").exists()
    assert json.loads(rec["hypotheses"])[0]["cause"] == "data"
    q = json.loads(rec["baseline_first_event"])
    assert max(q, key=q.get) == "data/corrupted"
    assert json.loads((tmp_path / "records" / "toy_a__data_nan__1.json").read_text())["key"] == rec["key"]
    # both runs of the pair happened, in the order the record names
    calls = [("toy_a", "data_nan", 1, True), ("toy_a", "data_nan", 1, False)]
    assert fake_zoo.calls[0] == ("toy_a", "healthy", 1, True)  # the once-per-process warm-up
    assert fake_zoo.calls[1:] == (calls if rec["timing_order"] == "monitored_first" else calls[::-1])


def test_healthy_record_has_empty_truth_and_prediction(fake_zoo, tmp_path):
    rec = H.run_one(H.RunSpec("toy_b", "healthy", 0, time_bare=False), tmp_path)
    assert rec["true_cause"] == rec["true_state"] == rec["pred_cause"] == ""
    assert rec["pred_prob"] is None and rec["seconds_bare"] is None and rec["p_healthy"] > 0.5


def test_failing_run_is_recorded_not_raised(fake_zoo, tmp_path):
    rec = H.run_one(H.RunSpec("toy_a", "broken", 0), tmp_path)
    assert rec["error"].startswith("RuntimeError: injected harness failure")
    assert rec["true_cause"] == "architecture"


def test_suite_is_resumable_and_writes_tables(fake_zoo, tmp_path):
    specs = H.plan(fake_zoo, seeds=1)
    df = H.run_suite(specs, tmp_path, workers=0, progress=False)
    assert len(df) == len(specs) == 2 * (3 + 3)
    assert set(df["timing_order"]) <= {"bare_first", "monitored_first", "none"}
    assert df.loc[df["injection"] == "lr_too_high", "seconds_bare"].isna().all()
    assert list(df.columns[: len(H.API_COLUMNS)]) == list(H.API_COLUMNS)
    n_calls = len(fake_zoo.calls)
    H.run_suite(specs, tmp_path, workers=0, progress=False)
    # only the errored runs are tried again
    assert len(fake_zoo.calls) - n_calls == 2
    H.run_suite(specs, tmp_path, workers=0, progress=False, retry_errors=False)
    assert len(fake_zoo.calls) - n_calls == 2
    assert (tmp_path / "records.csv").exists()
    # parquet is written exactly when a parquet engine is installed (docs/api.md: "when available")
    assert (tmp_path / "records.parquet").exists() == (importlib.util.find_spec("pyarrow") is not None)
    back = H.load_records(tmp_path)
    assert len(back) == len(df)
    healthy = back[back["injection"] == "healthy"]
    assert (healthy["true_cause"].fillna("") == "").all()
    csv = pd.read_csv(tmp_path / "records.csv")
    assert set(H.API_COLUMNS) <= set(csv.columns)


def test_resume_runs_again_the_records_other_code_made(fake_zoo, tmp_path, caplog):
    """Regression: a resumed folder kept records made before a change of the monitor, and priors
    fitted to them described the old code."""
    from neuraldbg.source import code_version

    specs = H.plan(fake_zoo, archs=["toy_a"], injections=["healthy"], seeds=1, healthy_seeds=2)
    H.run_suite(specs, tmp_path, workers=0, progress=False)
    df = H.load_records(tmp_path)
    assert set(df["code"]) == {code_version()}
    path = H.record_path(tmp_path, specs[0].key)
    rec = json.loads(path.read_text())
    rec["code"] = "0123456789ab"
    path.write_text(json.dumps(rec))
    n = len(fake_zoo.calls)
    H.run_suite(specs, tmp_path, workers=0, progress=False, keep_stale=True)
    assert len(fake_zoo.calls) == n  # kept on request
    with caplog.at_level("WARNING", logger="neuraldbg"):
        H.run_suite(specs, tmp_path, workers=0, progress=False)
    again = fake_zoo.calls[n:]
    assert again and {c[:3] for c in again} == {("toy_a", "healthy", specs[0].seed)}  # that record alone
    assert "1 record(s)" in caplog.text and "--keep-stale" in caplog.text
    assert json.loads(path.read_text())["code"] == code_version()


def test_cli_rejects_bad_arch_with_valid_names(fake_zoo, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli(["run", "--arch", "nope", "--out", str(tmp_path), "--workers", "0"])
    assert exc.value.code == 2
    assert "valid: toy_a, toy_b" in capsys.readouterr().err


def test_pair_order_alternates_across_runs(fake_zoo, tmp_path):
    specs = H.plan(fake_zoo, injections=["healthy"], seeds=1, healthy_seeds=8)
    orders = [H.run_one(s, tmp_path)["timing_order"] for s in specs]
    assert 0.25 <= orders.count("bare_first") / len(orders) <= 0.75


def test_layer_names_that_look_numeric_stay_text(tmp_path):
    (tmp_path / "records").mkdir()
    for i, layer in enumerate(["0", None]):
        rec = {"key": f"a__x__{i}", "arch": "a", "injection": "x", "seed": i, "origin_layer": layer,
               "true_layer": "0", "onset_step": 3 if layer else None, "error": ""}
        (tmp_path / "records" / f"a__x__{i}.json").write_text(json.dumps(rec))
    H.collect(tmp_path)
    for source in ("parquet", "csv"):
        df = H.load_records(tmp_path)
        assert df["true_layer"].tolist() == ["0", "0"], source
        assert df["origin_layer"].iloc[0] == "0" and pd.isna(df["origin_layer"].iloc[1]), source
        assert df["onset_step"].iloc[0] == 3 and pd.isna(df["onset_step"].iloc[1]), source
        (tmp_path / "records.parquet").unlink(missing_ok=True)


def test_every_sets_the_monitors_cadence_and_a_resume_at_another_one_runs_again(tmp_path, fake_zoo):
    import argparse
    import dataclasses

    assert H.monitor_arguments(H.RunSpec("toy_a", "healthy", 0)) is True          # the monitor's defaults
    assert H.monitor_arguments(H.RunSpec("toy_a", "healthy", 0, every="1")) == {"every": 1}
    assert H.monitor_arguments(H.RunSpec("toy_a", "healthy", 0, verify_steps=5, every="10")) == \
        {"snapshots": True, "every": 10}
    assert H.check_every_arg("auto") == "auto" and H.check_every_arg("01") == "1"
    for bad in ("0", "-3", "fast", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="auto or a positive integer"):
            H.check_every_arg(bad)
    spec = H.RunSpec("toy_a", "data_nan", 1, time_bare=False)
    rec = H.run_one(spec, tmp_path)
    assert rec["every"] == "auto"
    assert H._done_keys(tmp_path, [spec], retry_errors=True) == {spec.key}
    assert H._done_keys(tmp_path, [dataclasses.replace(spec, every="1")], retry_errors=True) == set()
