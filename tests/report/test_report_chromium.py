"""The report rendered by a real browser: headless Chromium takes a screenshot of the page,
which must not be blank. Slow (a browser start); installs Debian's ``chromium`` when missing
and it can (root with apt-get), and skips with the reason when it cannot (the helpers live in
docs/figures.py, which draws the docs' figure the same way)."""
from __future__ import annotations

from pathlib import Path

import pytest

from docs.figures import find_chromium, screenshot

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def browser():
    found = find_chromium(install=True)
    if found is None:
        pytest.skip("no Chromium: not on PATH, and the Debian package could not be installed here "
                    "(needs root, apt-get and a reachable package mirror)")
    return found


def test_screenshot_is_not_blank(tmp_path, browser):
    from PIL import Image

    from neuraldbg.examples import train_example

    run = train_example("mlp", "lr_too_high", seed=0, steps=60)
    html = Path(run.dbg.report(tmp_path / "report.html"))
    png = screenshot(browser, html, tmp_path / "report.png", 1000, 2400)
    import numpy as np

    img = Image.open(png).convert("RGB")
    assert img.size == (1000, 2400)
    px = np.asarray(img).reshape(-1, 3).astype(int)
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    empty = np.asarray(Image.open(screenshot(browser, blank, tmp_path / "blank.png", 1000, 2400)).convert("RGB"))
    assert (empty.reshape(-1, 3).min(axis=1) < 200).mean() == 0.0  # the check below tells blank from drawn
    ink = float((px.min(axis=1) < 200).mean())
    colours = {tuple(c) for c in np.unique(px[::97] // 32, axis=0)}
    assert ink > 0.02, f"only {ink:.1%} of the page has ink"
    assert len(colours) >= 8, f"only {len(colours)} colour bins: the charts did not render"
    # the event colours of the charts reach the screen (the exploding-gradient red)
    assert ((px[:, 0] > 180) & (px[:, 1] < 120) & (px[:, 2] < 120)).any()
