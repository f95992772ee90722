"""The README's integration snippets run as written (like docs/idioms.md's, in
tests/monitor/test_idioms.py): Lightning, the Trainer, TensorBoard and the report, in order."""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Lightning, the Trainer, TensorBoard and the HTML report"


def section_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end if end >= 0 else None], flags=re.S)


def test_the_section_links_the_committed_screenshot():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/report_example.png)" in text
    png = ROOT / "docs" / "report_example.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_integration_snippets_run(tmp_path, monkeypatch):
    pytest.importorskip("lightning", reason="the lightning extra is not installed")
    pytest.importorskip("transformers", reason="the transformers extra is not installed")
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    blocks = section_blocks()
    assert len(blocks) == 4
    monkeypatch.chdir(tmp_path)  # the snippets write their files into the current folder
    ns: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), ns)  # noqa: S102
    assert (tmp_path / "lightning_run.json").is_file()
    assert (tmp_path / "trainer_out" / "neuraldbg_session.json").is_file()
    assert any((tmp_path / "tb_runs" / "lr_too_high").iterdir())
    sections = []

    class Sections(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag == "section":
                sections.append(dict(attrs)["id"])

    Sections().feed((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert sections == ["summary", "loss", "timeline", "event-map", "posterior", "hypotheses", "chain"]
