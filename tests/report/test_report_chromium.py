"""The report rendered by a real browser: headless Chromium takes a screenshot of the page,
which must not be blank. Slow (a browser start); installs Debian's ``chromium`` when missing
and it can (root with apt-get), and skips with the reason when it cannot."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """A headless-capable Chromium on PATH, installing the Debian package when possible."""
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    if not shutil.which("apt-get"):
        return None
    if os.geteuid() != 0:
        return None
    try:
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True, capture_output=True, timeout=900,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    except (subprocess.SubprocessError, OSError):
        return None
    return shutil.which("chromium")


def screenshot(html: Path, png: Path, width: int = 1000, height: int = 2400, browser: str | None = None) -> Path:
    """Render ``html`` with headless Chromium into ``png`` (``width`` x ``height`` CSS pixels)."""
    browser = browser or find_chromium()
    if browser is None:
        raise FileNotFoundError("no chromium")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--no-first-run", "--disable-extensions", f"--user-data-dir={png.parent / 'chromium-profile'}",
                    f"--window-size={width},{height}", f"--screenshot={png}", html.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    return png


@pytest.fixture(scope="module")
def browser():
    found = find_chromium()
    if found is None:
        pytest.skip("no Chromium: not on PATH, and the Debian package could not be installed here "
                    "(needs root, apt-get and a reachable package mirror)")
    return found


def test_screenshot_is_not_blank(tmp_path, browser):
    from PIL import Image

    from neuraldbg.examples import train_example

    run = train_example("mlp", "lr_too_high", seed=0, steps=60)
    html = Path(run.dbg.report(tmp_path / "report.html"))
    png = screenshot(html, tmp_path / "report.png", browser=browser)
    import numpy as np

    img = Image.open(png).convert("RGB")
    assert img.size == (1000, 2400)
    px = np.asarray(img).reshape(-1, 3).astype(int)
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    empty = np.asarray(Image.open(screenshot(blank, tmp_path / "blank.png", browser=browser)).convert("RGB"))
    assert (empty.reshape(-1, 3).min(axis=1) < 200).mean() == 0.0  # the check below tells blank from drawn
    ink = float((px.min(axis=1) < 200).mean())
    colours = {tuple(c) for c in np.unique(px[::97] // 32, axis=0)}
    assert ink > 0.02, f"only {ink:.1%} of the page has ink"
    assert len(colours) >= 8, f"only {len(colours)} colour bins: the charts did not render"
    # the event colours of the charts reach the screen (the exploding-gradient red)
    assert ((px[:, 0] > 180) & (px[:, 1] < 120) & (px[:, 2] < 120)).any()
