"""The HTML report, parsed with ``html.parser``: every section, what each shows, no address
outside the file; from a live monitor, a loaded session, a merged DDP session and the CLI."""
from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser

import pytest

from neuraldbg import load_session, merge_sessions
from neuraldbg.cli import main
from neuraldbg.examples import ONSET, train_example
from neuraldbg.report.html import SECTIONS, render_html


class Page(HTMLParser):
    """Every element with its attributes and the id of the section it sits in; text per section."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict, str | None]] = []
        self.section: str | None = None
        self.sections: list[str] = []
        self.text: dict[str | None, list[str]] = {}
        self.labels: dict[str | None, list[str]] = {}  # <text class="layer"> contents (row labels)
        self._label = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs.get("id")
            self.sections.append(self.section)
        self.elements.append((tag, attrs, self.section))
        self._label = tag == "text" and "layer" in (attrs.get("class") or "").split()

    def handle_data(self, data):
        self.text.setdefault(self.section, []).append(data)
        if self._label:
            self.labels.setdefault(self.section, []).append(data)
            self._label = False

    def in_section(self, sid, tag=None, cls=None):
        return [a for t, a, s in self.elements if s == sid and (tag is None or t == tag)
                and (cls is None or cls in (a.get("class") or "").split())]

    def section_text(self, sid) -> str:
        return " ".join(self.text.get(sid, []))

    def prose(self, sid) -> str:
        """The section's text as a reader sees it: the chunks of inline elements (``<code>``)
        joined without the parser's seams, runs of spaces as one."""
        return re.sub(r"\s+", " ", "".join(self.text.get(sid, [])))


def plain(sentence: str) -> str:
    """An engine sentence as the page shows it: its ```name``` spans are set as code."""
    return sentence.replace("`", "")


@pytest.fixture(scope="module")
def lr_run():
    return train_example("mlp", "lr_too_high", seed=0, steps=60)


def assert_self_contained(text: str, page: Page) -> None:
    assert not re.search(r"(?i)\b(?:https?|ftp|wss?):|//[a-z0-9.-]+\.[a-z]{2,}", text), "an outside address"
    assert "url(" not in text and "@import" not in text
    for tag, attrs, _ in page.elements:
        assert tag not in ("script", "link", "img", "iframe", "object", "embed"), tag
        for name in ("src", "href", "xlink:href", "action", "srcset"):
            assert not attrs.get(name) or attrs[name].startswith("#"), (tag, name, attrs[name])


def test_every_section_of_a_failed_run(lr_run):
    dbg = lr_run.dbg
    text = render_html(dbg)
    page = Page(text)
    assert page.sections == list(SECTIONS)
    assert_self_contained(text, page)
    tr = dbg.trace()
    # the loss curve, with one marker per event
    assert len(page.in_section("loss", "polyline", "loss-line")) == 1
    assert len(page.in_section("loss", "g", "event-mark")) == len(tr.events) > 0
    # the layer x step map: one cell per event, rows in forward order
    cells = page.in_section("event-map", "rect", "event-cell")
    assert len(cells) == len(tr.events)
    assert {c["data-kind"] for c in cells} == {e.kind for e in tr.events}
    rows = page.labels["event-map"]
    layers = [r for r in rows if r != "(loss)"]
    assert set(layers) == {e.layer for e in tr.events if e.layer is not None}
    assert layers == sorted(layers, key=tr.layer_index)  # input side first
    assert rows[-1] == "(loss)" and any(e.layer is None for e in tr.events)
    # the posterior as bars, P(healthy) first
    assert page.labels["posterior"][0] == "P(healthy)"
    assert len(page.in_section("posterior", "rect", "bar")) == 1 + sum(len(d) for v, d in dbg.posterior().items()
                                                                          if v != "healthy")
    # the ranked hypotheses with their fixes and evidence
    hyps = dbg.get_causal_hypotheses()
    htext = page.prose("hypotheses")
    assert hyps and all(plain(h.suggested_fix) in htext and plain(h.description) in htext for h in hyps)
    assert len(page.in_section("hypotheses", "li")) == len(hyps)
    assert page.in_section("hypotheses", "table")
    # the causal chain, from the root cause through the first event
    chain = dbg.trace_causal_chain("exploding_gradients")
    ctext = page.section_text("chain")
    assert f"{chain.cause} = {chain.state}" in ctext
    assert f"in {chain.first_layer} at step {chain.first_step}" in ctext
    assert "P(healthy)" in page.section_text("timeline")
    assert "learning_rate = too_high" in page.section_text("timeline")  # the legend, as the posterior writes it


def test_backticks_are_rendered_as_code_and_probabilities_share_one_format(lr_run):
    """Regression: the engine's sentences showed their backticks literally (`` `0` ``), and a
    card said p = 0.999 next to its sentence's p=1.00."""
    text = render_html(lr_run.dbg)
    page = Page(text)
    assert "`" not in "".join(page.text.get("hypotheses", [])) + "".join(page.text.get("summary", []))
    top = lr_run.dbg.get_causal_hypotheses()[0]
    assert f"<code>{top.origin_layer}</code>" in text
    card = re.search(r"<li><b>[^<]*</b> \(p = ([0-9.]+)\)", text).group(1)
    assert f"(p = {card})" in top.description  # the card and its sentence: one number, two decimals
    bars = [t for t in page.text["posterior"] if re.fullmatch(r"\d\.\d+", t)]
    assert bars and all(re.fullmatch(r"\d\.\d\d", t) for t in bars)


def test_a_healthy_run_says_so(tmp_path):
    run = train_example("mlp", "healthy", seed=0, steps=60)
    path = run.dbg.report(tmp_path / "healthy.html")
    text = open(path, encoding="utf-8").read()
    page = Page(text)
    assert page.sections == list(SECTIONS)
    assert "no failure found" in page.section_text("summary")
    assert "No hypothesis" in page.section_text("hypotheses")
    assert page.in_section("event-map", "rect", "event-cell") == []


def test_the_summary_says_which_steps_were_checked(lr_run):
    from neuraldbg.trace import CadenceRecord

    page = Page(render_html(lr_run.dbg))
    # the default cadence: the first steps one by one, then what the run's timings chose
    assert "Checked every step for the first 33 steps, then every" in page.prose("summary")
    cadence = CadenceRecord("auto", 0.03, ((0, 1), (33, 2), (51, 7), (213, 1), (229, 7)), ((212, 213, "loss spike"),))
    trace = dataclasses.replace(lr_run.dbg.trace(), cadence=cadence)
    assert ("Checked every step for the first 33 steps, then every 7th step (budget 3 %); dense again after the "
            "loss spike at step 212.") in Page(render_html(trace)).prose("summary")
    assert "Checked" not in Page(render_html(dataclasses.replace(trace, cadence=None))).prose("summary")


def test_live_report_inside_the_loop_and_after_loading(tmp_path):
    import torch
    from torch.nn import functional as F

    from neuraldbg import NeuralDbg
    from neuraldbg.examples import build_model

    torch.manual_seed(0)
    model = build_model("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=50.0)
    gen = torch.Generator().manual_seed(1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(30):
            x = torch.randn(32, 16, generator=gen)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), x[:, :4].argmax(1))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            if step == 15:
                mid = Page(open(dbg.report(tmp_path / "mid.html"), encoding="utf-8").read())
    assert mid.sections == list(SECTIONS) and mid.in_section("event-map", "rect", "event-cell")
    session = load_session(dbg.export_aquarium_package(tmp_path / "run.json"))
    # the same page from the stored session (only the name of the priors' copy differs)
    def unsourced(page):
        return re.sub(r"posterior from [^<]*", "", page)
    assert unsourced(render_html(session)) == unsourced(render_html(dbg))


def _as_rank(trace, rank):
    return dataclasses.replace(trace, rank=rank, world_size=2,
                               events=tuple(dataclasses.replace(e, rank=rank) for e in trace.events))


def test_merged_ddp_session_has_a_rank_facet(tmp_path):
    healthy = train_example("mlp", "healthy", seed=0, steps=60).dbg.trace()
    broken = train_example("mlp", "nan_batch", seed=0, steps=60).dbg.trace()
    merged = merge_sessions([_as_rank(healthy, 0), _as_rank(broken, 1)])
    page = Page(render_html(merged))
    facets = [t.strip() for t in page.text["event-map"] if t.strip().startswith(("all ranks", "rank "))]
    assert facets == ["all ranks (seen on every rank)", "rank 0 only", "rank 1 only"]
    cells = page.in_section("event-map", "rect", "event-cell")
    assert len(cells) == len(broken.events) and any(c["data-kind"] == "nan" for c in cells)
    assert "ranks 0, 1 merged" in page.section_text("summary")
    assert f"at step {ONSET} [rank 1]" in page.section_text("chain")


def test_cli_report_single_and_merged(tmp_path, capsys):
    a = train_example("mlp", "lr_too_high", seed=0, steps=40).dbg.trace()
    paths = []
    for r in (0, 1):
        from neuraldbg.session import export_trace

        paths.append(export_trace(_as_rank(a, r), tmp_path / f"rank{r}.json"))
    out = tmp_path / "one.html"
    assert main(["report", paths[0], "-o", str(out)]) == 0
    assert Page(out.read_text(encoding="utf-8")).sections == list(SECTIONS)
    out2 = tmp_path / "sub" / "merged.html"
    assert main(["report", *paths, "-o", str(out2), "--title", "two ranks"]) == 0
    page = Page(out2.read_text(encoding="utf-8"))
    assert "two ranks" in " ".join(page.text[None])
    assert "all ranks (seen on every rank)" in page.section_text("event-map")
    assert f"Wrote {out2}" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == 1
    assert "not a NeuralDBG session" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
    assert main(["report", paths[0], "-o", str(tmp_path / "y.html"), "--family", "nope"]) == 1
    assert "unknown family 'nope'; valid: mlp" in capsys.readouterr().err
    assert main(["report", paths[0], "-o", str(tmp_path / "z.html"), "--family", "cnn"]) == 0
    assert "posterior from cnn.json" in (tmp_path / "z.html").read_text(encoding="utf-8")


def test_the_verdict_is_the_library_one(lr_run):
    """The summary says "no failure found" exactly when P(healthy) >= 0.5 (docs/api.md), listing
    a hypothesis above the floor as a weaker lead rather than as the verdict."""
    from neuraldbg.causal.types import Posterior
    from neuraldbg.report.html import ReportData, _summary

    hyp = dataclasses.replace(lr_run.dbg.get_causal_hypotheses()[0], probability=0.42)
    for p_healthy, expect in ((0.57, "no failure found (the hypotheses below are weaker leads)"),
                              (0.3, hyp.description.replace("`", ""))):
        post = Posterior({"learning_rate": {"ok": 0.58, "too_high": 0.42, "too_low": 0.0}}, p_healthy)
        d = ReportData(trace=lr_run.dbg.trace(), posterior=post, hypotheses=(hyp,), chains=(), timeline=(), ranks=())
        assert expect in Page(_summary(d)).prose("summary")


@pytest.mark.parametrize("step, end, text", [(1, 1, "step 1"), (1, None, "step 1"), (2, 4, "steps 2-4"),
                                             (0, 59, "steps 0-59")])
def test_one_step_reads_as_one_step(step, end, text):
    from neuraldbg.report.html import span_text

    assert span_text(step, end) == text


@pytest.mark.parametrize("x, text", [(0.0, "0"), (6.0, "6"), (10.8, "10.8"), (6.41, "6.41"), (0.0744, "0.0744"),
                                     (0.00714987, "0.00715"), (0.000412, "4.12×10<sup>−4</sup>"), (1234.0, "1230"),
                                     (4.3412e-6, "4.34×10<sup>−6</sup>"), (3.14159e9, "3.14×10<sup>9</sup>"),
                                     (-0.5, "−0.5")])
def test_a_severity_shows_three_significant_digits_and_never_a_false_zero(x, text):
    from neuraldbg.report.html import significant

    assert significant(x) == text


def test_the_evidence_table_writes_one_step_and_a_small_severity_as_they_are():
    """Regression: the table listed an ``exploding`` event over "steps 1-1" with severity 0. An
    exploding gradient's severity is log10 of its growth over the layer's baseline, 0 when a
    gradient above the absolute ceiling has not grown (``neuraldbg/events/gradient.py``), and
    tiny when it barely has; a one-step event is "step 1", and the severity keeps its magnitude,
    with the measured values that triggered it on hover."""
    from neuraldbg.events.base import Event
    from neuraldbg.report.html import _event_table

    values = {"grad_rms": 10.0095, "baseline_rms": float("nan"), "growth": 1.00095}
    events = [Event("gradient_health_transition", "exploding", "model.encoder.layer.11.attention.self.query", 1,
                    severity=0.000412, values=values),
              Event("gradient_health_transition", "exploding", "fc2", 12, severity=0.0),
              Event("optimizer_instability", "divergence", None, 4, end_step=59, count=56, severity=6.41)]
    table = _event_table(events)
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", table)]
    assert cells[2:6] == ["step 1", "1", "4.12×10−4", "exploding"]
    assert "steps 1-1" not in table and "step 12" in cells and "steps 4-59" in cells
    assert "title='baseline_rms nan, grad_rms 10.01, growth 1.001'" in table  # what triggered it, on hover
    assert "model.<wbr>encoder.<wbr>layer.<wbr>11." in table  # a long name may wrap at its dots
