"""Exported sessions: one versioned JSON document per run, and reading it back.

The schema is documented in ``docs/session_format.md``. Writes are atomic (temp file in
the same folder, then ``os.replace``; :mod:`neuraldbg.jsonio`) so a crash never leaves a
half-written session.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from neuraldbg.events.base import Event
from neuraldbg.events.compress import compress
from neuraldbg.jsonio import decode_float, decode_nonfinite, encode_nonfinite, write_json_atomic
from neuraldbg.queries import CausalQueries
from neuraldbg.trace import LayerInfo, LossSummary, Trace

SCHEMA = "neuraldbg.session"
SCHEMA_VERSION = 1


def trace_to_dict(trace: Trace, *, config: dict | None = None, priors: str | None = None) -> dict:
    """The JSON document of a trace (see ``docs/session_format.md``)."""
    from neuraldbg import __version__

    return encode_nonfinite({
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "neuraldbg_version": __version__,
        "family": trace.family,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "steps": {"first": trace.first_step, "last": trace.last_step},
        "model": {"layers": [{"name": l.name, "type": l.type, "index": l.index, "n_params": l.n_params}
                             for l in trace.layers]},
        "events": [e.to_dict() for e in trace.events],
        "propagation": [p.to_dict() for p in compress(trace.events, trace.layer_index)],
        "loss": {"n": trace.loss.n, "first": trace.loss.first, "last": trace.loss.last, "min": trace.loss.min,
                 "n_nonfinite": trace.loss.n_nonfinite, "first_nonfinite_step": trace.loss.first_nonfinite_step,
                 "history": [list(p) for p in trace.loss.history]},
        "config": config or {},
        "priors": priors,
        "meta": {k: (list(v) if isinstance(v, tuple) else v) for k, v in trace.meta},
    })


def trace_from_dict(doc: Any, source: str = "<dict>") -> tuple[Trace, dict]:
    """Inverse of :func:`trace_to_dict`; raises ``ValueError`` for foreign or broken documents."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{source} is not a NeuralDBG session (expected schema {SCHEMA!r})")
    version = doc.get("version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{source} has session schema version {version!r}; this NeuralDBG reads "
                         f"version {SCHEMA_VERSION}")
    try:
        # decode "nan"/"inf" strings only where numbers live: an event kind is also "nan"
        doc = dict(doc)
        doc["events"] = [{**e, "severity": decode_float(e.get("severity", 0.0)), "values": decode_nonfinite(e.get("values", {}))}
                         for e in doc["events"]]
        for k in ("loss", "meta", "config"):
            if k in doc:
                doc[k] = decode_nonfinite(doc[k])
        layers = tuple(LayerInfo(name=l["name"], type=l["type"], index=int(l["index"]),
                                 n_params=int(l.get("n_params", 0))) for l in doc["model"]["layers"])
        events = tuple(Event.from_dict(e) for e in doc["events"])
        lo = doc.get("loss") or {}
        loss = LossSummary(n=int(lo.get("n", 0)), first=lo.get("first"), last=lo.get("last"), min=lo.get("min"),
                           n_nonfinite=int(lo.get("n_nonfinite", 0)),
                           first_nonfinite_step=lo.get("first_nonfinite_step"),
                           history=tuple((int(s), float(v)) for s, v in lo.get("history", [])))
        meta = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (doc.get("meta") or {}).items()))
        trace = Trace(events=events, layers=layers, family=doc["family"], first_step=int(doc["steps"]["first"]),
                      last_step=int(doc["steps"]["last"]), loss=loss, rank=doc.get("rank"),
                      world_size=doc.get("world_size"), meta=meta)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source} is a damaged NeuralDBG session: {e!r}") from e
    return trace, doc


def export_trace(trace: Trace, path, *, config: dict | None = None, priors: str | None = None) -> str:
    """Write ``trace`` to ``path`` atomically; returns the path as a string."""
    return write_json_atomic(path, trace_to_dict(trace, config=config, priors=priors))


class Session(CausalQueries):
    """A session read back from disk: the same queries as the live monitor, offline."""

    def __init__(self, trace: Trace, doc: dict | None = None, path: str | None = None) -> None:
        self._trace = trace
        self.doc = doc or {}
        self.path = path
        self.family = trace.family
        self.priors_path = self.doc.get("priors")

    def trace(self) -> Trace:
        """The stored trace."""
        return self._trace

    @property
    def events(self) -> list[Event]:
        """The collapsed events, in step order."""
        return list(self._trace.events)

    def events_frame(self):
        """The events as a ``pandas.DataFrame``."""
        return events_frame(self._trace.events)

    def export_aquarium_package(self, path) -> str:
        """Write this session again (e.g. after merging); returns the path."""
        return export_trace(self._trace, path, config=self.doc.get("config"), priors=self.priors_path)

    def __repr__(self) -> str:
        return f"Session(family={self.family!r}, events={len(self._trace.events)}, path={self.path!r})"


def save_session(session: Any, path) -> str:
    """Write a live monitor's or a loaded session's trace to ``path`` (the plain-named twin of
    ``export_aquarium_package``); returns the path."""
    return session.export_aquarium_package(path)


def load_session(path) -> Session:
    """Read a session written by ``export_aquarium_package``; clear errors for bad files."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no session file at {p}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p} is not valid JSON (truncated or not a NeuralDBG session): {e}") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{p} is not a text file, so not a NeuralDBG session") from e
    trace, doc = trace_from_dict(doc, source=str(p))
    return Session(trace, doc, str(p))


def events_frame(events: Iterable[Event]):
    """Events as a DataFrame: the record fields, plus one ``value_<name>`` column per measured value."""
    import pandas as pd

    rows = []
    for e in events:
        d = e.to_dict()
        vals = d.pop("values")
        d.update({f"value_{k}": v for k, v in vals.items()})
        rows.append(d)
    cols = ["type", "kind", "layer", "step", "end_step", "count", "severity", "rank"]
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=cols)
    return df[cols + sorted(c for c in df.columns if c not in cols)]
