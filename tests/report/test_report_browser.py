"""The report in a real headless Chromium, driven through the DevTools protocol: at a phone's
420 px and a laptop's 1280 px the page never scrolls sideways, every chart fits the viewport,
the console stays clean; a screenshot of each goes into the test's folder. And the docs' figure
is what ``make docs-figures`` draws today. Slow (a browser per test); installs Debian's
``chromium`` when missing and it can (root with apt-get), and skips with the reason otherwise."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from docs import figures

pytestmark = pytest.mark.slow
pytest.importorskip("websocket", reason="websocket-client (the test extra) is not installed")
from devtools import Browser  # noqa: E402

#: what the page may not do at any width: scroll sideways, or hold a chart wider than the screen
LAYOUT = """(() => {
  const d = document.documentElement;
  const wide = [...document.querySelectorAll('svg, table, .chain, section')]
    .filter(e => e.getBoundingClientRect().right > innerWidth + 0.5).map(e => e.tagName + '#' + (e.id || ''));
  return {scroll: d.scrollWidth, inner: innerWidth, wide: wide, svgs: document.querySelectorAll('svg').length,
          code: document.querySelectorAll('code').length};
})()"""


@pytest.fixture(scope="module")
def chromium():
    found = figures.find_chromium(install=True)
    if found is None:
        pytest.skip("no Chromium: not on PATH, and the Debian package could not be installed here "
                    "(needs root, apt-get and a reachable package mirror)")
    return found


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    return figures.report_example(tmp_path_factory.mktemp("report"))


def layout(chromium, tmp_path, url, width, png=None):
    with Browser(chromium, tmp_path / f"profile-{width}") as b:
        b.open(url, width)
        got = b.evaluate(LAYOUT)
        got["errors"] = b.errors()
        if png is not None:
            b.screenshot(png)
    return got


@pytest.mark.parametrize("width", [420, 1280])
def test_the_report_fits_the_screen_with_a_clean_console(chromium, report, tmp_path, width):
    png = tmp_path / f"report-{width}px.png"
    got = layout(chromium, tmp_path, report.resolve().as_uri(), width, png)
    assert got["inner"] == width
    assert got["scroll"] <= width, f"the page scrolls sideways: {got['scroll']} px wide at {width} px"
    assert got["wide"] == [], f"wider than the screen: {got['wide']}"
    assert got["svgs"] >= 5 and got["code"] >= 1
    assert got["errors"] == []
    from PIL import Image

    img = Image.open(png)
    assert img.size[0] == width and img.size[1] > 1500
    px = np.asarray(img.convert("RGB")).reshape(-1, 3).astype(int)
    assert ((px[:, 0] > 180) & (px[:, 1] < 120) & (px[:, 2] < 120)).any()  # the charts' red reached the screen
    print(f"\nscreenshot: {png}")


def test_the_checks_catch_a_page_that_scrolls_or_logs_an_error(chromium, tmp_path):
    """The two checks above are not vacuous: a fixed 920 px chart and a console error are seen."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head><meta name='viewport' content='width=device-width'></head><body>"
                    "<svg width='920' height='50'></svg><script>console.error('broken')</script></body></html>")
    got = layout(chromium, tmp_path, page.resolve().as_uri(), 420)
    assert got["scroll"] > 420 and got["wide"] and got["errors"] == ["broken"]


def test_the_docs_figure_is_what_the_script_draws_today(chromium, tmp_path):
    """``docs/report_example.png`` is made by ``make docs-figures`` (docs/figures.py); drawn
    again now, it must match the committed one (same size, nearly the same pixels: fonts may
    anti-alias a little differently, a changed chart does not)."""
    from PIL import Image

    assert figures.main(["--out", str(tmp_path)]) == 0
    new = np.asarray(Image.open(tmp_path / "report_example.png").convert("L"), dtype=float)
    old = np.asarray(Image.open(figures.DOCS / "report_example.png").convert("L"), dtype=float)
    assert new.shape == old.shape, f"docs/report_example.png is stale ({old.shape} -> {new.shape}): make docs-figures"
    changed = float((np.abs(new - old) > 40).mean())
    assert changed < 0.002, f"docs/report_example.png is stale: {changed:.2%} of its pixels differ; make docs-figures"
