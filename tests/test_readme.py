"""The README's code runs as written: its first program (a complete script a newcomer copies),
and its integration snippets (like docs/idioms.md's, in tests/monitor/test_idioms.py):
Lightning, the Trainer, TensorBoard and the report, in order. All of them type-check."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Lightning, the Trainer, TensorBoard and the HTML report"


def python_blocks() -> list[str]:
    """Every ```python block of the README, in order."""
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)


def first_program() -> str:
    """The README's first ```python block: a complete program, data and model made in place."""
    return python_blocks()[0]


def section_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end if end >= 0 else None], flags=re.S)


#: the cause the first program injects (a learning rate 1000x too high), matched loosely so
#: that the sentences' wording ("learning_rate is too high", "learning rate too high") may change
INJECTED_CAUSE = (re.compile(r"learning[ _]rate", re.I), re.compile(r"too[ _]high", re.I))


def test_the_first_program_is_short_and_wraps_the_loop_in_one_line():
    code = first_program()
    assert len(code.splitlines()) <= 25
    assert "with NeuralDbg(model) as dbg:" in code
    assert "import" in code.splitlines()[0]  # it starts from its imports: nothing taken as given


def test_the_first_program_runs_as_written_and_names_the_cause_it_injects(tmp_path):
    """Regression: the README's first block used ``model``, ``optimizer`` and ``loader`` without
    defining them, so a newcomer's first copy-paste raised NameError."""
    script = tmp_path / "first.py"
    script.write_text(first_program(), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.startswith("P(healthy) = ")), None)
    assert head is not None and head + 1 < len(lines), res.stdout
    assert float(lines[head].split("=")[1]) < 0.5, res.stdout  # not healthy
    top = lines[head + 1]  # the most probable hypothesis' sentence
    assert all(p.search(top) for p in INJECTED_CAUSE), res.stdout


def test_the_readme_shows_what_the_first_program_prints():
    """The output captured beneath the first program names the same cause (its exact wording is
    refreshed by hand: rerun the block and paste what it prints)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index(first_program()) + len(first_program()):]
    shown = re.search(r"```text\n(.*?)```", after, flags=re.S)
    assert shown is not None and after.index("```text") < after.find("```python")
    lines = shown.group(1).splitlines()
    assert lines[0].startswith("P(healthy) = ")
    assert all(p.search(lines[1]) for p in INJECTED_CAUSE)


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
    assert sections == ["summary", "loss", "timeline", "event-map", "posterior", "hypotheses", "chain", "not-observed"]


#: mypy reads the snippets against this checkout's annotations (``mypy_path``); the frameworks
#: and numeric libraries are skipped (their names are ``Any``), so what is checked is the
#: package's own surface, in seconds rather than minutes
MYPY_CONFIG = """[mypy]
mypy_path = {root}
ignore_missing_imports = True
follow_imports = silent
cache_dir = {cache}

[mypy-torch.*,lightning.*,pytorch_lightning.*,transformers.*,accelerate.*,tensorboard.*,pgmpy.*,pandas.*,numpy.*,scipy.*,networkx.*]
follow_imports = skip
"""

#: the names the README's usage snippet takes as given
USAGE_PRELUDE = """import torch
from typing import Any, Iterable
model: torch.nn.Module
optimizer: torch.optim.Optimizer
loader: Iterable[tuple[torch.Tensor, torch.Tensor]]
criterion: Any
"""

#: what a type checker must see (not ``Any``) for the documented attributes to be checked
REVEAL = """
reveal_type(NeuralDbg(torch.nn.Linear(2, 2)).posterior())
reveal_type(callback)
reveal_type(hf_callback)
reveal_type(callback.diagnosis)
"""


def mypy(tmp_path, name: str, code: str, **more: str) -> subprocess.CompletedProcess:
    """mypy on ``code`` written to ``name`` (and on each further ``file_name=code``, as its own module)."""
    pytest.importorskip("mypy", reason="mypy (the test extra) is not installed")
    cfg = tmp_path / "mypy.ini"
    cfg.write_text(MYPY_CONFIG.format(root=ROOT, cache=tmp_path / "mypy-cache"))
    files = {name: code, **{f"{stem}.py": body for stem, body in more.items()}}
    for file_name, body in files.items():
        (tmp_path / file_name).write_text(body)
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(cfg), "--no-error-summary",
                           *(str(tmp_path / f) for f in files)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)


def test_readme_snippets_type_check_against_the_package_annotations(tmp_path):
    """Regression: ``dbg.posterior()`` was annotated ``dict[str, dict[str, float]]`` (so the
    documented ``.p_healthy`` was a mypy error) and ``NeuralDbgCallback`` was ``Any``."""
    first, usage, *integration = python_blocks()
    program = USAGE_PRELUDE + usage + "\n" + "\n".join(integration) + "\nfrom neuraldbg import NeuralDbg\n" + REVEAL
    res = mypy(tmp_path, "readme_snippets.py", program, readme_first=first)  # the first program stands alone
    lines = res.stdout.strip().splitlines()
    errors = [ln for ln in lines if ": error:" in ln]
    assert errors == [], "\n".join(errors)
    revealed = [ln.split('Revealed type is "', 1)[1].rstrip('"') for ln in lines if "Revealed type" in ln]
    assert revealed == ["neuraldbg.causal.types.Posterior", "neuraldbg.integrations.lightning.NeuralDbgCallback",
                        "neuraldbg.integrations.transformers.NeuralDbgCallback",
                        "neuraldbg.integrations.common.Diagnosis | None"], res.stdout


def test_the_type_check_catches_a_misuse(tmp_path):
    """The check above is not vacuous: a wrong attribute of the documented types is an error."""
    res = mypy(tmp_path, "misuse.py", "from neuraldbg import load_session\n"
               "load_session('run.json').posterior().p_healty\n")
    assert '"Posterior" has no attribute "p_healty"' in res.stdout, res.stdout
