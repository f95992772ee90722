"""The report in a real headless Chromium, driven through the DevTools protocol: at a phone's
420 px, a tablet's 768 px and a laptop's 1280 px the page never scrolls sideways (a box that
scrolls on its own may), chart text is drawn at 11 px or more, no chart text overlaps another
or leaves its chart, no legend overlaps a chart, and the console stays clean; for the example
report and for a run with long layer names (``docs/figures.py``); a screenshot of each goes into
the test's folder. And the docs' figure is what ``make docs-figures`` draws today. Slow (a browser
per test); installs Debian's ``chromium`` when missing and it can (root with apt-get), and skips
with the reason otherwise."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from docs import figures

pytestmark = pytest.mark.slow
pytest.importorskip("websocket", reason="websocket-client (the test extra) is not installed")
from devtools import Browser  # noqa: E402

WIDTHS = (420, 768, 1280)

#: what the page may not do at any width: scroll sideways, or hold an element wider than the
#: screen, unless that element sits in a box that scrolls sideways on its own and that box fits
LAYOUT = """(() => {
  const d = document.documentElement;
  const fits = e => { const r = e.getBoundingClientRect(); return r.left >= -0.5 && r.right <= innerWidth + 0.5; };
  const scroller = e => {
    for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === 'auto' || o === 'scroll') return p;
    }
    return null;
  };
  const wide = [...document.querySelectorAll('svg, table, .chain, section, .legend, p, li, pre, code')]
    .filter(e => !fits(e)).filter(e => { const s = scroller(e); return !(s && fits(s)); })
    .map(e => e.tagName + '#' + (e.id || '') + '.' + (e.getAttribute('class') || ''));
  return {scroll: d.scrollWidth, inner: innerWidth, wide: wide,
          charts: document.querySelectorAll('svg[role=img]').length,
          legends: document.querySelectorAll('.legend').length, code: document.querySelectorAll('code').length};
})()"""

#: every chart text as drawn (a displayed <text>): inside its chart's box (not clipped, not
#: spilling out), overlapping no other text of its chart; and no legend over a chart
CHART_TEXT = """(() => {
  const bad = [];
  const cut = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5
                        && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5;
  const name = t => (t.firstChild && t.firstChild.nodeValue || t.textContent).trim();
  const charts = [...document.querySelectorAll('svg[role=img]')];
  for (const svg of charts) {
    const box = svg.parentElement.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')].filter(t => t.getClientRects().length);
    const rects = texts.map(t => t.getBoundingClientRect());
    texts.forEach((t, i) => {
      const r = rects[i];
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
        bad.push('outside its chart: ' + name(t));
      for (let j = 0; j < i; j++) if (cut(r, rects[j])) bad.push('overlap: ' + name(texts[j]) + ' / ' + name(t));
    });
  }
  for (const legend of document.querySelectorAll('.legend'))
    for (const svg of charts)
      if (cut(legend.getBoundingClientRect(), svg.getBoundingClientRect())) bad.push('legend over a chart');
  return bad;
})()"""


@pytest.fixture(scope="module")
def chromium():
    found = figures.find_chromium(install=True)
    if found is None:
        pytest.skip("no Chromium: not on PATH, and the Debian package could not be installed here "
                    "(needs root, apt-get and a reachable package mirror)")
    return found


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("report")
    return {"example": figures.report_example(folder), "long_names": figures.report_long_names(folder)}


def layout(chromium, tmp_path, url, width, png=None, *expressions):
    with Browser(chromium, tmp_path / f"profile-{width}") as b:
        b.open(url, width)
        got = b.evaluate(LAYOUT)
        got["more"] = [b.evaluate(e) for e in expressions]
        got["errors"] = b.errors()
        if png is not None:
            b.screenshot(png)
    return got


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["example", "long_names"])
def test_the_report_fits_the_screen_with_a_clean_console(chromium, reports, tmp_path, name, width):
    png = tmp_path / f"{name}-{width}px.png"
    got = layout(chromium, tmp_path, reports[name].resolve().as_uri(), width, png, CHART_TEXT)
    assert got["inner"] == width
    assert got["scroll"] <= width, f"the page scrolls sideways: {got['scroll']} px wide at {width} px"
    assert got["wide"] == [], f"wider than the screen: {got['wide']}"
    assert got["charts"] >= 4 and got["legends"] >= 3 and got["code"] >= 1
    assert got["more"][0] == [], f"chart text clipped or overlapping at {width} px: {got['more'][0]}"
    assert got["errors"] == []
    from PIL import Image

    img = Image.open(png)
    assert img.size[0] == width and img.size[1] > 1500
    px = np.asarray(img.convert("RGB")).reshape(-1, 3).astype(int)
    assert ((px[:, 0] > 180) & (px[:, 1] < 120) & (px[:, 2] < 120)).any()  # the charts' red reached the screen
    print(f"\nscreenshot: {png}")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["example", "long_names"])
def test_chart_text_is_readable_at_every_width(chromium, reports, tmp_path, name, width):
    """Regression: at 420 px the 920-unit charts shrank with the page and their text to 4-5 px.
    The smallest text drawn in any <svg> (font-size as computed, times the scale of each
    viewBox around it) is at least 11 CSS px."""
    got = layout(chromium, tmp_path, reports[name].resolve().as_uri(), width, None, figures.SVG_FONT_PROBE)
    font = got["more"][0]
    assert font["n"] > 20, font  # the probe saw the charts' text
    assert font["min"] >= figures.MIN_CHART_FONT_PX, f"{name} at {width} px: {font}"
    print(f"\n{name} at {width} px: smallest chart text {font['min']:.2f} px ({font['n']} texts, {font['text']!r})")


def test_the_checks_catch_a_page_that_scrolls_or_logs_an_error(chromium, tmp_path):
    """The checks above are not vacuous: a fixed 920 px chart, a scaled-down chart's tiny text,
    overlapping and clipped chart text and a console error are seen; a wide chart in a box that
    scrolls on its own is allowed."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head><meta name='viewport' content='width=device-width'></head><body>"
                    "<svg width='920' height='50'></svg>"
                    "<div style='overflow-x:auto'><svg id='boxed' width='920' height='20'></svg></div>"
                    "<svg role='img' viewBox='0 0 920 40' width='920' height='40' style='max-width:100%;height:auto'>"
                    "<text x='10' y='20' font-size='11'>scaled</text></svg>"
                    "<div style='width:300px'><svg role='img' width='300' height='40'><text x='0' y='20'>over</text>"
                    "<text x='12' y='22'>lapping</text><text x='280' y='20'>clipped</text></svg></div>"
                    "<script>console.error('broken')</script></body></html>")
    got = layout(chromium, tmp_path, page.resolve().as_uri(), 420, None, figures.SVG_FONT_PROBE, CHART_TEXT)
    assert got["scroll"] > 420 and got["wide"] == ["svg#."] and got["errors"] == ["broken"]
    font, text = got["more"]
    assert font["min"] < 6 and font["text"] == "scaled"  # 11 x 396/920
    assert "overlap: over / lapping" in text and "outside its chart: clipped" in text


def test_the_docs_figures_are_what_the_script_draws_today(chromium, tmp_path):
    """``docs/report_example.png`` and the report at each width (``docs/report_<w>px.png``,
    ``docs/report_long_names_<w>px.png``) are made by ``make docs-figures`` (docs/figures.py);
    drawn again now, each must match the committed one (same size, nearly the same pixels: fonts
    may anti-alias a little differently, a changed chart does not)."""
    from PIL import Image

    assert figures.main(["--out", str(tmp_path)]) == 0
    names = ["report_example.png"] + [f"{n}_{w}px.png" for n in ("report", "report_long_names") for w in WIDTHS]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(names)
    for name in names:
        new = np.asarray(Image.open(tmp_path / name).convert("L"), dtype=float)
        old = np.asarray(Image.open(figures.DOCS / name).convert("L"), dtype=float)
        assert new.shape == old.shape, f"docs/{name} is stale ({old.shape} -> {new.shape}): make docs-figures"
        changed = float((np.abs(new - old) > 40).mean())
        assert changed < 0.002, f"docs/{name} is stale: {changed:.2%} of its pixels differ; make docs-figures"
