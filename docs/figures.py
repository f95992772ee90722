"""Every figure under ``docs/``, drawn from today's code: ``make docs-figures``.

A figure that is committed by hand goes stale as soon as the code that draws it changes; this
script is the one way they are made, and ``tests/report/test_report_browser.py`` checks that
the committed one matches what it draws now. Today there is one, ``docs/report_example.png``:
the HTML report of the built-in MLP trained with a learning rate 1000x too high
(``neuraldbg.examples``: seeded, the same run on every machine), rendered by headless Chromium
at 1000 CSS pixels wide, the whole page.

Chromium is the Debian ``chromium`` package (``apt-get install chromium``) or any
``chromium``/``google-chrome`` on ``PATH``; the tests use the same helpers.
"""
from __future__ import annotations

import argparse
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
        png = screenshot(browser, report_example(Path(tmp)), out / "report_example.png", FIGURE_WIDTH)
    print(f"Wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
