"""A real install: build the wheel, install it into a fresh virtual environment, and run
``neuraldbg explain`` there on an exported session. Slow (a build and a venv).

Nothing is downloaded: the wheel is built without build isolation from this environment's
setuptools, installed with ``--no-deps``, and the fresh environment sees this one's
dependencies (torch, numpy, pandas, pgmpy) through a ``.pth`` file, which adds their folder
to ``sys.path`` without running its ``.pth`` files, so the checkout's editable install stays
invisible and the package imported there is the wheel's.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from neuraldbg.vocab import FAMILIES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert res.returncode == 0, f"{cmd}\n{res.stdout}\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("build", reason="the build package (test extra) is not installed")
    src = tmp_path_factory.mktemp("src")
    # a clean copy: no egg-info, build folder or caches from the checkout leak into the wheel
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "neuraldbg", src / "neuraldbg", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, src])
    (whl,) = dist.glob("neuraldbg-*.whl")
    return whl


def test_wheel_ships_priors_typing_marker_and_license(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "neuraldbg/py.typed" in names
    assert {f"neuraldbg/priors/{f}.json" for f in FAMILIES} <= names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert {"neuraldbg/report/html.py", "neuraldbg/integrations/lightning.py"} <= names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "License-Expression: MIT" in meta and "Classifier: Typing :: Typed" in meta
    assert "Provides-Extra: lightning" in meta


def test_installed_wheel_explains_an_exported_session(wheel, tmp_path, capsys):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    res = _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", wheel])
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("Successfully installed"))
    with capsys.disabled():
        print(f"\nwheel install: {line}")
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(site, "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    from neuraldbg.examples import train_example

    session = train_example("mlp", "lr_too_high", seed=0, steps=40).dbg.export_aquarium_package(tmp_path / "run.json")
    where = _run([py, "-c", "import neuraldbg, pathlib; print(pathlib.Path(neuraldbg.__file__).resolve())"],
                 cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv.resolve())), where  # the wheel's copy, not the checkout's
    out = _run([venv / "bin" / "neuraldbg", "explain", session], cwd=tmp_path).stdout
    assert "learning rate too high" in out
    html = tmp_path / "report.html"
    _run([venv / "bin" / "neuraldbg", "report", session, "-o", html], cwd=tmp_path)
    assert html.stat().st_size > 5000
