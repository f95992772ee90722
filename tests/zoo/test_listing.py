"""``python -m models`` lists every architecture and injection with its ground truth."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import models
from models.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_listing_names_every_arch_injection_and_truth(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for arch in models.architectures():
        assert f"{arch}  [family {models.family(arch)}" in out
        for inj in models.injections(arch):
            assert inj.name in out
            if inj.truth:
                assert "/".join(inj.truth) in out


def test_json_listing_and_bad_names(capsys):
    assert main(["rl", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["arch"] for r in rows] == ["rl"]
    truths = {i["name"]: i["truth"] for i in rows[0]["injections"]}
    assert truths["rl_value_explosion"] == "data/shifted" and truths["healthy"] == ""
    assert main(["resnet"]) == 2
    assert "valid: mlp" in capsys.readouterr().err


def test_run_subcommand(capsys):
    assert main(["run", "mlp", "data_nan", "--steps", "30"]) == 0
    out = capsys.readouterr().out
    assert "truth ('data', 'corrupted')" in out and "symptom nonfinite: shown" in out


def test_python_dash_m_from_a_checkout():
    p = subprocess.run([sys.executable, "-m", "models", "gnn"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "arch_unstable" in p.stdout and "architecture/unstable" in p.stdout
