"""Importing NeuralDBG, its integrations and its report loads no training framework.

Each check runs in a fresh interpreter (like the torch/pgmpy check in tests/test_package.py):
the test process itself has Lightning and transformers loaded by the other tests.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("lightning", "pytorch_lightning", "transformers", "tensorboard", "tensorboardX", "torch.utils.tensorboard",
         "accelerate")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_import_neuraldbg_loads_no_framework():
    res = _run(f"import sys, neuraldbg\nbad = [m for m in {HEAVY!r} if m in sys.modules]\nprint(bad)\n"
               "assert not bad, bad")
    assert res.returncode == 0, res.stderr


def test_integration_and_report_modules_load_no_framework_nor_torch():
    code = ("import sys\n"
            "import neuraldbg.integrations, neuraldbg.integrations.lightning, neuraldbg.integrations.transformers\n"
            "import neuraldbg.integrations.common, neuraldbg.report.html, neuraldbg.report.tensorboard\n"
            f"bad = [m for m in {HEAVY!r} + ('torch', 'pgmpy') if m in sys.modules]\n"
            "assert not bad, bad\n")
    res = _run(code)
    assert res.returncode == 0, res.stderr


def test_report_of_a_stored_trace_needs_no_torch(tmp_path):
    """The report reads stored results only: a hand-made trace renders without torch."""
    code = ("import sys\n"
            "from neuraldbg.events.base import Event\n"
            "from neuraldbg.trace import LayerInfo, LossSummary, Trace\n"
            "from neuraldbg.report.html import write_report\n"
            "t = Trace(events=(Event('gradient_health_transition', 'exploding', 'fc', 3, 5),), "
            "layers=(LayerInfo('fc', 'Linear', 0, 10),), family='mlp', first_step=0, last_step=9, "
            "loss=LossSummary(n=10, first=1.0, last=9.0, min=1.0, history=tuple((i, 1.0 + i) for i in range(10))))\n"
            f"write_report(t, {str(tmp_path / 'r.html')!r})\n"
            "assert 'torch' not in sys.modules\n")
    res = _run(code)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r.html").stat().st_size > 1000


BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {names!r}:
            raise ImportError('blocked for the test: ' + name)
sys.meta_path.insert(0, Block())
"""


@pytest.mark.parametrize("module, hidden", [("lightning", ("lightning", "pytorch_lightning")),
                                            ("transformers", ("transformers",))])
def test_missing_framework_names_the_install(module, hidden):
    code = BLOCK.format(names=hidden) + (
        f"from neuraldbg.integrations import {module}\n"
        f"try:\n    {module}.NeuralDbgCallback\nexcept ImportError as e:\n    print(e)\n"
        "else:\n    raise SystemExit('no ImportError')\n")
    res = _run(code)
    assert res.returncode == 0, res.stderr
    assert f"pip install {module}" in res.stdout
