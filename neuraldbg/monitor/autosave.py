"""Autosave: the session written to disk while training runs, so a killed run keeps its diagnosis.

``NeuralDbg(model, autosave="run.json", autosave_interval=30.0)`` (``docs/api.md``, "Autosave
and files"). On entry, on checked steps at most every ``autosave_interval`` seconds of wall
time (``0``: every checked step) and on exit, also when the loop body raises, the session is
written atomically (temp file, ``fsync``, rename), so a run killed at any moment (preemption,
OOM kill, ``kill -9``) leaves the last complete session at that path.

What stays on the training thread is building the document: the queued statistics are moved
to the host (one sync) and the events and trace assembled, the same work as one query. The
JSON encoding and the disk write run on a background thread. While that thread is still
writing, checked steps do not build a new document: saves coalesce instead of queueing, so
a slow disk never slows training down.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from neuraldbg.lifecycle import Addon, AddonContext

log = logging.getLogger("neuraldbg")


def check_autosave(path: Any, interval: Any) -> tuple[str, float]:
    """``(path, interval)`` validated at construction, before any training happens."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"autosave must be a file path or None, got {type(path).__name__}")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) \
            or interval < 0:
        raise ValueError(f"autosave_interval must be a finite number of seconds >= 0 (0: every checked step), "
                         f"got {interval!r}")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"autosave path {p} is a directory; give a file path such as {p / 'run.json'}")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # missing folders are created on the first save
    if not parent.is_dir():
        raise ValueError(f"autosave path {p}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"autosave path {p}: the folder {parent} is not writable")
    return os.fspath(path), float(interval)


class _Writer:
    """One background thread writing the latest document handed to it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._cv = threading.Condition()
        self._pending: tuple[int, dict] | None = None
        self._writing = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._failed: set[str] = set()

    def busy(self) -> bool:
        """Whether a document is waiting or being written."""
        with self._cv:
            return self._writing or self._pending is not None

    def submit(self, step: int, doc: dict) -> None:
        """Hand ``doc`` to the thread (it replaces one still waiting)."""
        with self._cv:
            self._pending = (step, doc)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="neuraldbg-autosave", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def wait(self) -> None:
        """Block until everything handed over is on disk."""
        with self._cv:
            while self._writing or self._pending is not None:
                self._cv.wait()

    def close(self) -> None:
        """Finish pending work and stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._pending is None:
                    return
                (step, doc), self._pending = self._pending, None
                self._writing = True
            try:
                self.write(step, doc)
            except Exception:  # noqa: BLE001 - e.g. a user's log handler: the thread must live on
                pass
            finally:
                with self._cv:
                    self._writing = False
                    self._cv.notify_all()

    def write(self, step: int, doc: dict) -> None:
        """Write one document now (any thread); failures are logged once per kind, never raised."""
        from neuraldbg.jsonio import write_json_atomic

        try:
            write_json_atomic(self.path, doc, indent=None, fsync=True)
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop training
            key = type(exc).__name__
            if key not in self._failed:
                self._failed.add(key)
                log.warning("neuraldbg: autosave to %s failed: %r", self.path, exc)
            return
        log.debug("neuraldbg: autosaved %s at step %d", self.path, step)


class Autosave(Addon):
    """The :class:`Addon` behind ``NeuralDbg(autosave=..., autosave_interval=...)``.

    ``saves`` counts documents built and ``build_seconds`` the training-thread time spent
    building them (what autosave costs the loop; the write itself runs elsewhere).
    """

    def __init__(self, path: Any, interval: Any = 30.0) -> None:
        self.path, self.interval = check_autosave(path, interval)
        self._writer = _Writer(self.path)
        self._last = -math.inf
        self.saves = 0
        self.build_seconds = 0.0

    def _document(self, ctx: AddonContext) -> tuple[int, dict]:
        from neuraldbg.session import trace_to_dict

        t0 = time.perf_counter()
        trace = ctx.trace()
        doc = trace_to_dict(trace, config=ctx.settings.config.to_dict(), priors=ctx.settings.priors)
        self.build_seconds += time.perf_counter() - t0
        self.saves += 1
        return trace.last_step, doc

    def enter(self, ctx: AddonContext) -> None:
        """Write the (empty) session at once, so the file exists from the first step on."""
        self._last = time.monotonic()
        self._writer.write(*self._document(ctx))

    unchecked = ()  # written on checked steps only

    def step_closed(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """Hand a fresh document to the writer when the interval has passed and it is idle."""
        if not checked:
            return
        now = time.monotonic()
        if now - self._last < self.interval or self._writer.busy():
            return
        self._last = now
        self._writer.submit(*self._document(ctx))

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Write the final session (also when the loop raised) and stop the writer thread."""
        self._writer.close()  # an older document must not land after the final one
        self._writer.write(*self._document(ctx))
