"""Every figure under ``docs/``, drawn from today's code: ``make docs-figures``.

A figure that is committed by hand goes stale as soon as the code that draws it changes; this
script is the one way they are made. Today there is one, ``docs/report_example.png``: the HTML
report of the built-in MLP trained with a learning rate 1000x too high (``neuraldbg.examples``:
seeded, the same run on every machine), rendered by headless Chromium at 1000 CSS pixels wide,
the whole page. Beside it, ``docs/report_example.sha256`` holds the digest of the HTML it was
drawn from (:func:`source_digest`): ``make test`` compares it with the report drawn today, no
browser needed (``tests/report/test_docs_figure.py``), and fails when the figure is stale.

Chromium is the Debian ``chromium`` package (``apt-get install chromium``) or any
``chromium``/``google-chrome`` on ``PATH``; the tests use the same helpers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
if __name__ == "__main__":  # run as a script: draw with this checkout's package, not another install
    sys.path.insert(0, str(DOCS.parent))
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: a quiet, offline, throwaway headless browser: no GPU, no sandbox (root in a container),
#: nothing fetched in the background, no first-run pages
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--hide-scrollbars")
#: the width of the docs' report figure, in CSS pixels
FIGURE_WIDTH = 1000
#: the digest of the HTML the committed figure shows (written with it by :func:`main`)
DIGEST = DOCS / "report_example.sha256"
#: a tag, whose decimals (attributes: chart coordinates and sizes) the digest masks, and a decimal
_TAG = re.compile(r"<[^>]*>")
_DECIMAL = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def find_chromium(install: bool = False) -> str | None:
    """A headless-capable Chromium on ``PATH``; with ``install``, Debian's ``chromium``
    package is installed when it is missing and this is root with ``apt-get``."""
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    if not install or not shutil.which("apt-get") or os.geteuid() != 0:
        return None
    try:
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True, capture_output=True, timeout=900,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    except (subprocess.SubprocessError, OSError):
        return None
    return shutil.which("chromium")


def run_chromium(browser: str, args: list[str], profile: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """One headless Chromium run with :data:`FLAGS` and a profile folder of its own."""
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args], check=True, capture_output=True,
                          text=True, timeout=timeout)


def page_height(browser: str, html: Path, width: int, profile: Path) -> int:
    """The height of ``html`` laid out ``width`` CSS pixels wide (a copy of the page with a
    probe script; the page itself has none)."""
    probe = profile.parent / f"{html.stem}.probe.html"
    script = ("<script>addEventListener('load',()=>{const p=document.createElement('pre');p.id='probe';"
              "p.textContent=JSON.stringify({h:document.documentElement.scrollHeight});"
              "document.body.appendChild(p)})</script>")
    probe.write_text(html.read_text(encoding="utf-8").replace("<head>", "<head>" + script, 1), encoding="utf-8")
    dom = run_chromium(browser, [f"--window-size={width},1000", "--dump-dom", probe.resolve().as_uri()], profile).stdout
    found = re.search(r'<pre id="probe">([^<]*)</pre>', dom)
    if found is None:
        raise RuntimeError(f"Chromium laid out no page for {html}")
    return int(json.loads(found.group(1))["h"])


def screenshot(browser: str, html: Path, png: Path, width: int, height: int | None = None) -> Path:
    """``html`` rendered ``width`` CSS pixels wide into ``png``: the whole page, unless
    ``height`` is given."""
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "profile"
        height = height or page_height(browser, html, width, profile)
        run_chromium(browser, [f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
                               html.resolve().as_uri()], profile)
    return png


def report_example(folder: Path) -> Path:
    """The report of the docs' example run, written into ``folder``."""
    from neuraldbg.examples import train_example

    run = train_example("mlp", "lr_too_high", seed=0, steps=60)
    return Path(run.dbg.report(folder / "report_example.html"))


def source_digest(html: str) -> str:
    """The sha256 of a report's HTML as its figure shows it.

    Text, markup and styles count exactly; the decimals inside tags (chart coordinates) are
    masked, since the last bits of a float differ between CPUs' kernels while the figure does not
    change with them. A changed sentence, count, table row, chart element or style changes it.
    """
    canonical = _TAG.sub(lambda tag: _DECIMAL.sub("#", tag.group(0)), html)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def committed_digest() -> str | None:
    """The digest written with the committed figure (None: none written)."""
    if not DIGEST.exists():
        return None
    return DIGEST.read_text(encoding="utf-8").split()[0]


def main(argv: list[str] | None = None) -> int:
    """Write every figure (into ``--out``, by default ``docs/``); 1 without Chromium."""
    parser = argparse.ArgumentParser(prog="docs/figures.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DOCS), help="folder to write the figures to (default docs/)")
    args = parser.parse_args(argv)
    browser = find_chromium()
    if browser is None:
        print("docs/figures.py: error: no Chromium on PATH; install one (Debian: apt-get install chromium)",
              file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        html = report_example(Path(tmp))
        png = screenshot(browser, html, out / "report_example.png", FIGURE_WIDTH)
        digest = out / DIGEST.name
        digest.write_text(f"{source_digest(html.read_text(encoding='utf-8'))}  report_example.html\n",
                          encoding="utf-8")
    print(f"Wrote {png} and {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
