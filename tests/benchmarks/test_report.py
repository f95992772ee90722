"""The report from stored records (made by the harness with a stand-in zoo)."""
from __future__ import annotations

import json

import pytest

from benchmarks import harness as H
from benchmarks import report as R
from benchmarks.__main__ import main as cli


@pytest.fixture
def bench_dir(fake_zoo, tmp_path):
    H.run_suite(H.plan(fake_zoo, seeds=3, healthy_seeds=9), tmp_path, workers=0, progress=False)
    return tmp_path


def test_report_writes_markdown_plots_and_goals(bench_dir, capsys):
    assert cli(["report", str(bench_dir), "--null-draws", "200"]) == 0
    text = (bench_dir / "REPORT.md").read_text()
    for part in ("## Goals", "bayes_net", "first_event", "threshold_rules", "Confusion matrix",
                 "Per family", "Prior tuning and generalization", "Errored runs", "reliability.png"):
        assert part in text
    for png in R.PLOTS:
        assert (bench_dir / png).stat().st_size > 1000
    summary = json.loads((bench_dir / "summary.json").read_text())
    verdicts = {g["goal"]: g["verdict"] for g in summary["goals"]}
    # the stand-in monitor always names the truth: every accuracy goal passes
    assert verdicts["top-1 overall >= 0.90"] == "PASS"
    assert verdicts["healthy false-alarm rate <= 0.02"] == "PASS"
    assert summary["n_errors"] == 6
    assert "PASS" in capsys.readouterr().out
    # the stand-in sessions are no NeuralDBG sessions: the headline counts them as skipped, and
    # a report of one zoo folder still has the ecosystem columns, at n = 0
    assert "## Suites side by side" in text and "without a usable session" in text
    suites = json.loads((bench_dir / "suites.json").read_text())
    assert suites["table"]["eco_hand_set"]["n"] == 0 and suites["counts"]["zoo"]["errored"] == 6


def test_the_report_says_which_code_made_its_records(bench_dir):
    from neuraldbg.source import code_version

    one = f"Every record was made by code `{code_version()}` (`neuraldbg/source.py`)."
    assert R.code_line(H.load_records(bench_dir)) == one
    assert cli(["report", str(bench_dir), "--null-draws", "200"]) == 0
    assert one in (bench_dir / "REPORT.md").read_text()
    path = next((bench_dir / "records").glob("*.json"))
    rec = json.loads(path.read_text())
    rec["code"] = "0123456789ab"
    path.write_text(json.dumps(rec))
    line = R.code_line(H.collect(bench_dir))
    assert "made by 2 versions of the code" in line and "`0123456789ab` 1" in line
    assert R.code_line(H.load_records(bench_dir).drop(columns="code")) == "The records do not say which code made them."


def test_a_run_with_a_note_is_scored_and_listed_with_it(bench_dir):
    """A run that ran otherwise than written (a CPU fallback) is neither dropped nor silent."""
    before = R.evaluate(H.load_records(bench_dir), null_draws=100)
    path = next(p for p in sorted((bench_dir / "records").glob("*.json")) if not json.loads(p.read_text())["error"])
    rec = json.loads(path.read_text())
    rec["note"] = "nn.LSTM ran in float32"
    path.write_text(json.dumps(rec))
    H.collect(bench_dir)
    res = R.evaluate(H.load_records(bench_dir), null_draws=100)
    assert res["n_runs"] == before["n_runs"] and res["notes"].to_dict("records") == [
        {"key": rec["key"], "note": "nn.LSTM ran in float32"}]
    assert cli(["report", str(bench_dir), "--null-draws", "200"]) == 0
    text = (bench_dir / "REPORT.md").read_text()
    assert "## Runs with a note" in text and rec["key"] in text.split("## Runs with a note")[1]


def test_evaluate_counts_and_scores(bench_dir):
    res = R.evaluate(H.load_records(bench_dir), null_draws=100)
    assert res["n_runs"] == 2 * (9 + 6) and res["n_healthy"] == 18
    assert res["overall"].loc["bayes_net", "top1"] == 1.0
    assert res["confusion"].to_numpy().sum() == res["n_runs"]
    assert res["localization"]["layer_acc"] == 1.0
    assert set(res["overhead"].index) == {"toy_a", "toy_b"}
    assert res["overhead"]["ratio_median"].iloc[0] == pytest.approx(1.2)


def test_publish_copies_report_and_images(bench_dir, tmp_path):
    pub = tmp_path / "docs" / "benchmark.md"
    R.write_report(bench_dir, publish=pub, null_draws=100)
    assert "](benchmark/reliability.png)" in pub.read_text()
    assert (tmp_path / "docs" / "benchmark" / "confusion.png").exists()


def test_report_on_missing_folder_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli(["report", str(tmp_path / "nope")])
    assert "does not exist" in capsys.readouterr().err


def test_publish_fills_the_marked_section_of_a_guide(bench_dir, tmp_path):
    guide = tmp_path / "benchmark.md"
    guide.write_text(f"# Guide\nintro\n{R.MARK_START}\nSTALE-REPORT\n{R.MARK_END}\noutro\n")
    R.write_report(bench_dir, publish=guide, null_draws=100)
    text = guide.read_text()
    assert text.startswith("# Guide\nintro\n") and text.endswith("outro\n") and "STALE-REPORT" not in text
    assert "## Latest results" in text and "### Goals" in text
