"""A diagnosis says what it did not see: ``neuraldbg explain`` (text and ``--json``) and the HTML
report list the unobserved evidence variables by reason and the monitor's internal errors, and a
run in which nothing was observed reads as no diagnosis, never as a verdict (``docs/api.md``,
"Coverage"). End to end through saved sessions."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from neuraldbg import NeuralDbg, load_session
from neuraldbg.causal import api
from neuraldbg.cli import main
from neuraldbg.report import coverage as coverage_text
from neuraldbg.report.html import SECTIONS, render_html
from neuraldbg.session import export_trace
from neuraldbg.trace import Signatures
from tests.report.test_html_report import Page
from tests.tiny import make_trace, mlp, run, tagged


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """Three saved sessions: a monitor entered and left without a step (nothing observed), a
    healthy 60-step run, and that run's trace with a monitor gap and two internal errors."""
    d = tmp_path_factory.mktemp("sessions")
    idle = NeuralDbg(mlp())
    with idle:
        pass
    healthy = run(steps=60, monitor={"optimizer": True}).dbg
    tr = healthy.trace()
    # as if no optimizer had been found: the step size unmeasured, a gap saying why
    gaps = dict(tr.signatures.gaps(), step_ratio_median="no optimizer found")
    values = {k: v for k, v in tr.signatures.items() if not k.startswith("step_ratio")}
    flawed = dataclasses.replace(tr, internal_errors=2, signatures=Signatures(values, gaps=gaps))
    return {"nothing": idle.save_session(d / "nothing.json"), "healthy": healthy.save_session(d / "healthy.json"),
            "flawed": export_trace(flawed, d / "flawed.json")}


def explain(capsys, *argv) -> str:
    assert main(["explain", *map(str, argv)]) == 0
    return capsys.readouterr().out


def test_nothing_observed_is_no_diagnosis_in_the_text(sessions, capsys):
    out = explain(capsys, sessions["nothing"])
    post = load_session(sessions["nothing"]).posterior()
    assert post.nothing_observed
    assert "Nothing was observed (no loss and no layer statistics): no diagnosis." in out
    assert f"The prior alone gives P(healthy) = {post.p_healthy:.2f}" in out
    assert not re.search(r"P\(healthy\) = [\d.]+: (not )?healthy", out)  # no verdict line
    assert "Hypotheses" not in out and "No hypothesis" not in out
    assert "Prior (nothing observed):" in out and "\nPosterior:" not in out
    cov = load_session(sessions["nothing"]).coverage()
    assert f"Not observed: {len(cov.unobserved())} of {len(cov)} evidence variables" in out
    assert "no layer statistics reached the monitor on any checked step" in out


def test_nothing_observed_in_json(sessions, capsys):
    doc = json.loads(explain(capsys, sessions["nothing"], "--json"))
    assert doc["nothing_observed"] is True and doc["healthy"] is None and doc["hypotheses"] == []
    assert doc["coverage"] == load_session(sessions["nothing"]).coverage().to_dict()
    assert doc["coverage"]["nothing_observed"] is True
    # explain with or without a failure type: nothing to explain either
    assert json.loads(explain(capsys, sessions["nothing"], "--json", "-f", "data_anomaly"))["hypotheses"] == []


def test_healthy_run_lists_what_it_could_not_show(sessions, capsys):
    out = explain(capsys, sessions["healthy"])
    cov = load_session(sessions["healthy"]).coverage()
    assert re.search(r"P\(healthy\) = 0\.9\d\d: healthy\n", out)
    unobs = cov.unobserved()
    assert unobs and not cov.gaps()  # a plain model with its optimizer: nothing missed by the monitor
    assert f"Not observed: {len(unobs)} of {len(cov)} evidence variables\n  not shown by this run:\n" in out
    assert coverage_text.MISSED not in out and "internal error" not in out
    for var, why in unobs.items():
        assert re.search(rf"^    (\w+, )*{var}(, \w+)*: {re.escape(why)}$", out, re.M), var
    doc = json.loads(explain(capsys, sessions["healthy"], "--json"))
    assert doc["nothing_observed"] is False and doc["healthy"] is True
    assert set(doc["coverage"]["variables"]) == set(cov)


def test_gaps_and_internal_errors_are_printed(sessions, capsys):
    out = explain(capsys, sessions["flawed"])
    assert "  missed by the monitor:\n    step_size: no optimizer found\n" in out
    assert out.index(coverage_text.MISSED) < out.index(coverage_text.NOT_SHOWN)  # gaps first
    assert "The monitor hit 2 internal errors; see the log" in out
    assert out.index("Not observed:") < out.index("Posterior:")


def test_variables_sharing_a_reason_are_one_line():
    cov = api.coverage(load_session_trace_without_layers())
    lines = coverage_text.text_lines(cov)
    groups = coverage_text.groups(cov)
    assert len(groups) < len(cov.unobserved())  # grouped: fewer lines than variables
    assert sum(len(g.variables) for g in groups) == len(cov.unobserved())
    for g in groups:
        assert sum(1 for line in lines if line.endswith(f": {g.reason}")) == 1


def load_session_trace_without_layers():
    """A trace with a loss but no monitored layer: every layer variable shares one reason."""
    return make_trace(losses=[1.0 * 0.97 ** i for i in range(40)])


def test_report_of_nothing_observed_shows_a_banner_not_a_verdict(sessions):
    text = render_html(load_session(sessions["nothing"]))
    page = Page(text)
    assert page.sections == list(SECTIONS)
    summary = page.prose("summary")
    assert "Nothing was observed: no diagnosis." in summary and "no failure found" not in summary
    assert page.in_section("summary", "p", "banner") and not page.in_section("summary", "p", "big")
    assert "Prior (nothing observed)" in page.prose("posterior")
    assert "nothing was observed to diagnose" in page.prose("hypotheses")
    assert "no layer statistics reached the monitor" in page.prose("not-observed")


def test_report_lists_what_was_not_observed_and_the_internal_errors(sessions):
    sess = load_session(sessions["flawed"])
    page = Page(render_html(sess))
    cov = sess.coverage()
    text = page.prose("not-observed")
    assert f"{len(cov.unobserved())} of {len(cov)} evidence variables were not observed" in text
    assert "Missed by the monitor" in text and "step_size: no optimizer found" in text
    for var in cov.unobserved():
        assert var in text
    assert "The monitor hit 2 internal errors; see the log" in text
    assert page.in_section("summary", "a") and "2 internal errors" in page.prose("summary")
    healthy = Page(render_html(load_session(sessions["healthy"])))
    assert "no failure found" in healthy.prose("summary") and "Missed by the monitor" not in healthy.prose(
        "not-observed")


def test_a_hypothesis_names_its_unmeasured_evidence_in_the_cli_and_report(tmp_path, capsys):
    """Parameters of a type the monitor does not read: the hypothesis that rests on them says what
    it did not see, in ``explain`` and in the report (``unobserved_note`` of causal/fixes.py)."""
    torch.manual_seed(0)
    dbg = run(tagged(mlp()), steps=30, monitor={"optimizer": True}).dbg
    path = dbg.save_session(tmp_path / "tagged.json")
    out = explain(capsys, path)
    assert "missed by the monitor:\n    exploding, vanishing, detached, init_scale: 4 parameters are Tagged" in out
    noted = [h for h in dbg.get_causal_hypotheses() if "Not observed:" in h.description]
    page = Page(render_html(load_session(path)))
    for h in noted:
        assert h.description in out and h.description.replace("`", "") in page.prose("hypotheses")
    assert "4 parameters are Tagged tensors" in page.prose("not-observed")
