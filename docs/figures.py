"""Every figure under ``docs/``, drawn from today's code: ``make docs-figures``.

A figure that is committed by hand goes stale as soon as the code that draws it changes; this
script is the one way they are made. ``docs/report_example.png``: the HTML report of the
built-in MLP trained with a learning rate 1000x too high (``neuraldbg.examples``: seeded, every
step checked, the same run on every machine), rendered by headless Chromium at 1000 CSS pixels
wide, the whole page. Beside it, ``docs/report_example.sha256`` holds the digest of the HTML it was drawn from
(:func:`source_digest`): ``make test`` compares it with the report drawn today, no browser
needed (``tests/report/test_docs_figure.py``), and fails when the figure is stale.

``docs/report_420px.png``, ``report_768px.png`` and ``report_1280px.png`` show the same report
at a phone's, a tablet's and a laptop's width, and ``docs/report_long_names_<width>px.png`` the
report of a run whose layers have long names (:func:`report_long_names`:
``model.encoder.layer.11.attention.self.query``), each the whole page at the viewport's width.
They are drawn through the DevTools protocol over a pipe (:class:`Page`: no port, no package
beyond the standard library), since ``--window-size`` cannot make a viewport narrower than
about 500 px; for each, the script prints the smallest chart text as rendered
(:data:`SVG_FONT_PROBE`), which ``tests/report/test_report_browser.py`` holds at 11 px or more.

Chromium is the Debian ``chromium`` package (``apt-get install chromium``) or any
``chromium``/``google-chrome`` on ``PATH``; the tests use the same helpers.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
#: the widths of the docs' responsive figures (a phone, a tablet, a laptop), in CSS pixels
WIDTHS = (420, 768, 1280)
#: the smallest chart text the report may render at any width, in CSS pixels
MIN_CHART_FONT_PX = 11.0
#: JavaScript: the smallest font of the text drawn inside any ``<svg>`` of the page as rendered,
#: in CSS pixels: each ``<text>``/``<tspan>`` that is displayed, its computed font-size times
#: the scale of every ``<svg>`` around it that has a viewBox (rendered size / viewBox size);
#: with the element's text, and how many were measured
SVG_FONT_PROBE = """(() => {
  let min = Infinity, text = null, n = 0;
  for (const t of document.querySelectorAll('svg text, svg tspan')) {
    if (!t.getClientRects().length) continue;  // not rendered: display:none (a narrow-only label)
    let scale = 1;
    for (let e = t.parentElement; e; e = e.parentElement) {
      const vb = e.tagName.toLowerCase() === 'svg' && e.viewBox && e.viewBox.baseVal;
      if (vb && vb.width > 0 && vb.height > 0) {
        const r = e.getBoundingClientRect();
        scale *= Math.min(r.width / vb.width, r.height / vb.height);
      }
    }
    const px = parseFloat(getComputedStyle(t).fontSize) * scale;
    n += 1;
    if (px < min) { min = px; text = t.textContent.trim().slice(0, 60); }
  }
  return {min: n ? min : null, text: text, n: n};
})()"""
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


def _above(fd: int, low: int) -> int:
    """``fd`` moved to a descriptor number at or above ``low`` (the old one closed)."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return moved


class Page:
    """``with Page(browser, profile) as page:`` one headless Chromium tab driven through the
    DevTools protocol over ``--remote-debugging-pipe`` (NUL-separated JSON on the browser's file
    descriptors 3 and 4): no port, no websocket, only the standard library."""

    def __init__(self, browser: str, profile: Path, timeout: float = 120.0) -> None:
        self.browser, self.profile, self.timeout = browser, profile, timeout
        self.proc: subprocess.Popen | None = None
        self.session: str | None = None
        self.events: list[dict] = []
        self._id = 0
        self._buf = b""

    def __enter__(self) -> "Page":
        to_browser, self._out = os.pipe()     # we write commands, the browser reads them on fd 3
        self._in, from_browser = os.pipe()    # the browser writes answers on fd 4, we read them
        # the browser's ends above fd 4, so that putting one on 3 cannot overwrite the other
        to_browser, from_browser = (_above(fd, 10) for fd in (to_browser, from_browser))

        def onto_3_and_4() -> None:  # in the child, before exec: dup2 clears close-on-exec
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.proc = subprocess.Popen([self.browser, *FLAGS, f"--user-data-dir={self.profile}",
                                      "--remote-debugging-pipe", "about:blank"], pass_fds=(3, 4),
                                     preexec_fn=onto_3_and_4, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        deadline = time.monotonic() + self.timeout
        while True:
            pages = [t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page"]
            if pages:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium opened no page")
            time.sleep(0.1)
        self.session = self.send("Target.attachToTarget", targetId=pages[0]["targetId"], flatten=True)["sessionId"]
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.session = None
                self.send("Browser.close")
        except (OSError, RuntimeError, TimeoutError):
            pass
        finally:
            for fd in (self._out, self._in):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()

    def _recv(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium stopped answering")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, **params: Any) -> dict:
        """Run one command (in the page once attached); events meanwhile go to :attr:`events`."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if self.session is not None:
            msg["sessionId"] = self.session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        while True:
            got = self._recv()
            if got.get("id") == self._id:
                if "error" in got:
                    raise RuntimeError(f"{method}: {got['error']}")
                return got.get("result", {})
            self.events.append(got)

    def open(self, url: str, width: int, height: int = 900) -> None:
        """Load ``url`` in a ``width`` x ``height`` CSS-pixel viewport and wait for its load."""
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        self.events = []
        self.send("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._recv())

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def screenshot(self, png: Path) -> Path:
        """The whole page at the viewport's width into ``png``."""
        w = self.evaluate("document.documentElement.clientWidth")
        h = self.evaluate("document.documentElement.scrollHeight")
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": w, "height": h, "scale": 1})["data"]
        png.write_bytes(base64.b64decode(data))
        return png


def screenshot_at(browser: str, html: Path, png: Path, width: int) -> dict:
    """``html`` laid out ``width`` CSS pixels wide (any width, a phone's too) into ``png``, the
    whole page; returns the smallest chart text as rendered (:data:`SVG_FONT_PROBE`) and the
    page's scroll width."""
    with tempfile.TemporaryDirectory() as tmp, Page(browser, Path(tmp) / "profile") as page:
        page.open(html.resolve().as_uri(), width)
        found = page.evaluate(SVG_FONT_PROBE)
        found["scroll_width"] = page.evaluate("document.documentElement.scrollWidth")
        page.screenshot(png)
    return found


def report_example(folder: Path) -> Path:
    """The report of the docs' example run, written into ``folder``."""
    from neuraldbg.examples import train_example

    # every step checked: the default every="auto" times the machine it runs on from step 51 on,
    # and the figure must be the same on every machine
    run = train_example("mlp", "lr_too_high", seed=0, steps=60, monitor={"every": 1})
    return Path(run.dbg.report(folder / "report_example.html"))


#: the docs' long-names run: a BERT-like encoder's last two blocks, named as the full model
#: names them (``model.encoder.layer.11.attention.self.query``), trained with a learning rate
#: far too high
LONG_NAMES_LR = 5.0
LONG_NAMES_STEPS = 30


def long_names_model(d_in: int = 16, d: int = 16, n_classes: int = 4) -> Any:
    """A tiny transformer encoder whose modules nest as deep as a Hugging Face BERT's: blocks
    ``model.encoder.layer.10`` and ``.11`` (the last two of twelve), each with
    ``attention.self.{query,key,value}``, ``attention.output.dense``, ``intermediate.dense``
    and ``output.dense``; over (batch, tokens, ``d_in``) inputs, ``n_classes`` logits."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Dense(nn.Module):
        def __init__(self, a: int, b: int) -> None:
            super().__init__()
            self.dense = nn.Linear(a, b)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.dense(h)

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            q, k, v = self.query(h), self.key(h), self.value(h)
            return torch.softmax(q @ k.transpose(1, 2) / d ** 0.5, -1) @ v

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.self = SelfAttention()  # ``self``, as BERT names it
            self.output = Dense(d, d)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + self.output(self.self(h))

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention, self.intermediate, self.output = Attention(), Dense(d, 2 * d), Dense(2 * d, d)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            h = self.attention(h)
            return h + self.output(F.gelu(self.intermediate(h)))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.ModuleDict({"10": Layer(), "11": Layer()})

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            for block in self.layer.values():
                h = block(h)
            return h

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embeddings, self.encoder, self.pooler = Dense(d_in, d), Encoder(), Dense(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.pooler(self.encoder(self.embeddings(x)).mean(1))

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.classifier = Bert(), nn.Linear(d, n_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.model(x))

    return Classifier()


def report_long_names(folder: Path, seed: int = 0) -> Path:
    """The report of :func:`long_names_model` trained :data:`LONG_NAMES_STEPS` steps at a
    learning rate of :data:`LONG_NAMES_LR` (seeded like ``neuraldbg.examples``: a random linear
    teacher labels Gaussian inputs), written into ``folder``; its events sit on layers such as
    ``model.encoder.layer.11.attention.self.query``."""
    import torch
    from torch.nn import functional as F

    from neuraldbg import NeuralDbg

    torch.manual_seed(seed)
    model = long_names_model()
    gen = torch.Generator().manual_seed(seed + 1)
    teacher = torch.randn(16, 4, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=LONG_NAMES_LR, momentum=0.9)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(LONG_NAMES_STEPS):
            x = torch.randn(32, 8, 16, generator=gen)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), (x.mean(1) @ teacher).argmax(1))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return Path(dbg.report(folder / "report_long_names.html"))


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
        for name, page in (("report", html), ("report_long_names", report_long_names(Path(tmp)))):
            for width in WIDTHS:
                png = out / f"{name}_{width}px.png"
                found = screenshot_at(browser, page, png, width)
                print(f"Wrote {png}: smallest chart text {found['min']} px ({found['n']} texts measured, "
                      f"smallest {found['text']!r}), page {found['scroll_width']} px wide")
    return 0


if __name__ == "__main__":
    sys.exit(main())
