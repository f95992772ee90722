"""A minimal Chrome DevTools Protocol client for the report's browser tests: one headless
Chromium with a remote-debugging port on the loopback, one page, commands and their events over
a plain websocket (``websocket-client``, in the test extra).

``--window-size`` cannot make a viewport narrower than Chromium's smallest window (about
500 px); the protocol's ``Emulation.setDeviceMetricsOverride`` can, which is why the tests that
measure a phone-sized layout use this rather than the command-line screenshot."""
from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from docs.figures import FLAGS


class Browser:
    """``with Browser(chromium, profile) as b:`` a page driven through the protocol."""

    def __init__(self, executable: str, profile: Path, timeout: float = 60.0) -> None:
        self.executable, self.profile, self.timeout = executable, profile, timeout
        self.proc: subprocess.Popen | None = None
        self.ws: Any = None
        self.events: list[dict] = []
        self._id = 0

    def __enter__(self) -> "Browser":
        import websocket

        self.proc = subprocess.Popen([self.executable, *FLAGS, f"--user-data-dir={self.profile}",
                                      "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = self._port()
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium opened no page")
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=self.timeout,
                                              suppress_origin=True)
        return self

    def _port(self) -> int:
        """The port Chromium chose, from its ``DevTools listening on ws://...`` line."""
        assert self.proc is not None and self.proc.stderr is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                return int(found.group(1))
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError("Chromium did not open its DevTools port")

    def __exit__(self, *exc: Any) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def send(self, method: str, **params: Any) -> dict:
        """Run one command; events that arrive meanwhile are kept in :attr:`events`."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, event: str) -> dict:
        """The first ``event`` (kept or still to come)."""
        for msg in self.events:
            if msg.get("method") == event:
                return msg
        while True:
            msg = json.loads(self.ws.recv())
            self.events.append(msg)
            if msg.get("method") == event:
                return msg

    def open(self, url: str, width: int, height: int = 900) -> None:
        """Load ``url`` in a ``width`` x ``height`` CSS-pixel viewport, console and log on."""
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (failed loads) so far."""
        out = []
        for msg in self.events:
            method, params = msg.get("method"), msg.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                out.append(str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(str(params["entry"].get("text")))
        return out

    def screenshot(self, png: Path) -> Path:
        """The whole page (not only the viewport) into ``png``."""
        w = self.evaluate("document.documentElement.scrollWidth")
        h = self.evaluate("document.documentElement.scrollHeight")
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": w, "height": h, "scale": 1})["data"]
        png.write_bytes(base64.b64decode(data))
        return png
