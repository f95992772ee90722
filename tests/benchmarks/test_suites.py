"""Suites (``--suite``), their record keys and the ``suite`` column, with stand-in suites."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import harness as H
from benchmarks import records as R
from benchmarks import suites as S
from benchmarks.__main__ import main as cli

ROOT = Path(__file__).resolve().parents[2]


def test_cli_rejects_an_unknown_suite_naming_the_valid_ones(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli(["run", "--suite", "nope", "--out", str(tmp_path), "--workers", "0"])
    assert exc.value.code == 2
    assert "unknown suite 'nope'; valid: zoo, ecosystem" in capsys.readouterr().err
    with pytest.raises(ValueError, match="valid: zoo, ecosystem"):
        S.get_suite("nope")


def test_zoo_records_carry_suite_zoo(fake_zoo, tmp_path):
    rec = H.run_one(H.RunSpec("toy_a", "data_nan", 0, time_bare=False), tmp_path)
    assert rec["suite"] == "zoo" and rec["key"] == "toy_a__data_nan__0"
    assert json.loads((tmp_path / "records" / "toy_a__data_nan__0.json").read_text())["suite"] == "zoo"
    H.run_suite(H.plan(fake_zoo, archs=["toy_b"], seeds=1), tmp_path, workers=0, progress=False)
    for df in (R.collect(tmp_path), R.load_records(tmp_path)):
        assert "suite" in df.columns and (df["suite"] == "zoo").all()


def test_other_suites_get_prefixed_keys_and_their_own_run_list(tmp_path):
    assert H.RunSpec("gat", "healthy", 0).key == "gat__healthy__0"
    assert H.RunSpec("gat", "healthy", 0, suite="ecosystem").key == "ecosystem__gat__healthy__0"
    inj = [SimpleNamespace(name=n) for n in ("healthy", "lr_too_high")]
    eco = SimpleNamespace(architectures=lambda: ["gpt2", "gat"], injections=lambda arch: inj,
                          suite_runs=lambda quick: [("gpt2", "healthy", 0), ("gpt2", "lr_too_high", 1),
                                                    ("gat", "healthy", 0)][: 1 if quick else None])
    specs = S.suite_plan(eco, quick=False, archs=["gpt2"], bare_seeds=1, suite="ecosystem")
    assert [(s.arch, s.injection, s.seed, s.time_bare) for s in specs] == [
        ("gpt2", "healthy", 0, True), ("gpt2", "lr_too_high", 1, False)]
    assert [s.key for s in S.suite_plan(eco, quick=True, suite="ecosystem")] == ["ecosystem__gpt2__healthy__0"]
    with pytest.raises(ValueError, match="valid: gpt2, gat"):
        S.suite_plan(eco, quick=True, archs=["nope"], suite="ecosystem")


def test_records_without_a_suite_are_zoo_records_and_nonfinite_values_survive(tmp_path):
    (tmp_path / "records").mkdir()
    # a record written before the suite column existed
    (tmp_path / "records" / "a__x__0.json").write_text(json.dumps({"key": "a__x__0", "arch": "a", "injection": "x",
                                                                   "seed": 0, "error": ""}))
    rec = R.empty_record("a__y__0", "zoo", "a", "y", 0, None)
    rec.update(error="", loss_last=math.nan, post_data_ok=math.inf, first_event_kind="nan")
    path = R.write_record(tmp_path, rec)
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    back = R.read_record(path)
    assert math.isnan(back["loss_last"]) and back["post_data_ok"] == math.inf and back["first_event_kind"] == "nan"
    df = R.collect(tmp_path)
    assert df["suite"].tolist() == ["zoo", "zoo"]


def test_the_ecosystem_suite_is_imported_only_when_asked_for():
    code = ("import sys; from benchmarks import harness, suites; suites.get_suite('zoo'); "
            "assert 'benchmarks.ecosystem' not in sys.modules, 'imported eagerly'")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
