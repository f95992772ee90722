"""Exported sessions: one versioned JSON document per run, and reading it back.

The schema is documented in ``docs/session_format.md`` and checked by
:func:`neuraldbg.schema.check_session`. Writes are atomic (temp file in the same folder, then
``os.replace``; :mod:`neuraldbg.jsonio`) so a crash never leaves a half-written session. A
session names the priors it was diagnosed with, so it answers the same on any machine: the
family's shipped priors (part of the installed package) by family and fingerprint, any other
priors embedded whole. Reading one never opens another path.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Iterable

from neuraldbg.events.base import Event
from neuraldbg.events.compress import compress
from neuraldbg.jsonio import encode_nonfinite, write_json_atomic
from neuraldbg.queries import CausalQueries
from neuraldbg.schema import SESSION_SCHEMA, SessionFormatError, check_session, read_json
from neuraldbg.trace import CadenceRecord, LayerInfo, LossSummary, Signatures, Trace

log = logging.getLogger("neuraldbg")

SCHEMA = SESSION_SCHEMA
#: Version written; versions 1 (priors named by path), 2 (signatures as ``meta``), 3 (no gaps
#: or internal errors), 4 (shipped priors embedded too) and 5 (no cadence) are still read, see
#: load_session.
SCHEMA_VERSION = 6
_EMBEDDED = " (embedded)"
#: fingerprint -> (embedded content as read, validated Priors): sessions of one run share them
_embedded_cache: dict[str, tuple[Any, Any]] = {}
#: (fingerprint, source) -> the priors block documents embed
_block_cache: dict[tuple[str, str], dict] = {}


def priors_field(priors: Any, family: str) -> dict:
    """The ``priors`` field a session of ``family`` is written with: a reference
    ``{"shipped": family, "fingerprint"}`` when ``priors`` (a path, a ``Priors`` or None) are
    that family's shipped priors, else the embedded block (:func:`priors_block`).

    The shipped files are part of the installed package, so a reference answers the same
    offline at a fraction of the size (they are most of an embedding session). A user's file
    is embedded even when it equals the shipped one: it is their pinned choice, which a later
    version's shipped file must not replace. Treat the result as read-only.
    """
    from neuraldbg.causal.priors import as_priors, load_priors

    pri = as_priors(priors, family) or load_priors(family=family)
    if pri.shipped and pri.family == family:
        return {"shipped": family, "fingerprint": pri.fingerprint}
    return priors_block(pri, family)


def priors_block(priors: Any, family: str) -> dict:
    """The embedded form of a session's ``priors`` field: the validated priors themselves,
    their source (a label, never opened again) and their fingerprint. Built once per prior
    source and shared by the documents that embed it (autosave builds many): treat it as
    read-only."""
    from neuraldbg.causal.priors import as_priors, load_priors

    pri = as_priors(priors, family) or load_priors(family=family)
    # the label without what loading a session added to it (a shipped file's is its name)
    source = f"{pri.family}.json" if pri.shipped else \
        pri.source[:-len(_EMBEDDED)] if pri.source.endswith(_EMBEDDED) else pri.source
    block = _block_cache.get((pri.fingerprint, source))
    if block is None:
        if len(_block_cache) >= 64:
            _block_cache.clear()
        block = {"source": source, "fingerprint": pri.fingerprint, "content": encode_nonfinite(pri.to_dict())}
        _block_cache[(pri.fingerprint, source)] = block
    return block


def trace_to_dict(trace: Trace, *, config: dict | None = None, priors: Any = None,
                  embed_priors: bool = True) -> dict:
    """The JSON document of a trace (see ``docs/session_format.md``). ``priors`` (a path, a
    ``Priors`` or None for the family's shipped priors) is recorded in the document: referred
    to when they are the family's shipped priors, else embedded (:func:`priors_field`);
    ``embed_priors=False`` leaves ``priors`` null (read back as the family's shipped priors)."""
    from neuraldbg import __version__

    doc = encode_nonfinite({
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "neuraldbg_version": __version__,
        "family": trace.family,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "steps": {"first": trace.first_step, "last": trace.last_step},
        "model": {"layers": [{"name": l.name, "type": l.type, "index": l.index, "n_params": l.n_params,
                              **({"role": l.role} if l.role else {})} for l in trace.layers]},
        "events": [e.to_dict() for e in trace.events],
        "propagation": [p.to_dict() for p in compress(trace.events, trace.layer_index)],
        "loss": {"n": trace.loss.n, "first": trace.loss.first, "last": trace.loss.last, "min": trace.loss.min,
                 "n_nonfinite": trace.loss.n_nonfinite, "first_nonfinite_step": trace.loss.first_nonfinite_step,
                 "history": [list(p) for p in trace.loss.history]},
        "config": config or {},
        "priors": None,  # below: already JSON-ready (and, when embedded, the bulk of the document)
        "signatures": signatures_to_dict(trace.signatures),
        "gaps": trace.signatures.gaps(),
        "internal_errors": trace.internal_errors,
    })
    if trace.cadence is not None:
        doc["cadence"] = cadence_to_dict(trace.cadence)
    if embed_priors:
        doc["priors"] = priors_field(priors, trace.family)
    return doc


def cadence_to_dict(cad: CadenceRecord) -> dict:
    """The ``cadence`` field of a session (version 6): which steps the monitor checked."""
    return {"every": cad.every, "budget": cad.budget, "changes": [list(c) for c in cad.changes],
            "alarms": [list(a) for a in cad.alarms], "changes_omitted": cad.changes_omitted,
            "alarms_omitted": cad.alarms_omitted}


def cadence_from_dict(d: dict | None) -> CadenceRecord | None:
    """Inverse of :func:`cadence_to_dict` on a checked document's ``cadence`` (None stays None)."""
    if d is None:
        return None
    return CadenceRecord(every=d["every"], budget=d["budget"], changes=tuple(tuple(c) for c in d["changes"]),
                         alarms=tuple(tuple(a) for a in d["alarms"]), changes_omitted=d["changes_omitted"],
                         alarms_omitted=d["alarms_omitted"])


def signatures_to_dict(sigs: Signatures) -> dict[str, dict]:
    """The ``signatures`` field of a session: ``{name: {"value": v, "step": s}}``."""
    steps = sigs.steps()
    return {k: {"value": list(v) if isinstance(v, tuple) else v, "step": steps.get(k)} for k, v in sigs.items()}


def trace_from_dict(doc: Any, source: str = "<dict>") -> tuple[Trace, dict]:
    """Inverse of :func:`trace_to_dict`: the trace and the checked, normalized document.

    Raises :class:`~neuraldbg.schema.SessionFormatError` (a ``ValueError``) naming ``source``
    and the field for a foreign, broken or out-of-range document, an undeclared signature
    included.
    """
    from neuraldbg.causal.nodes import RENAMED, check_signature

    d = check_session(doc, source, signature=check_signature, renamed=RENAMED)
    sigs = d["signatures"]
    lo = d["loss"]
    trace = Trace(events=tuple(Event.from_dict(e) for e in d["events"]),
                  layers=tuple(LayerInfo(**l) for l in d["model"]["layers"]), family=d["family"],
                  first_step=d["steps"]["first"], last_step=d["steps"]["last"],
                  loss=LossSummary(n=lo["n"], first=lo["first"], last=lo["last"], min=lo["min"],
                                   n_nonfinite=lo["n_nonfinite"], first_nonfinite_step=lo["first_nonfinite_step"],
                                   history=tuple(lo["history"])),
                  rank=d["rank"], world_size=d["world_size"],
                  signatures=Signatures({k: v for k, (v, _) in sigs.items()}, {k: s for k, (_, s) in sigs.items()},
                                        d["gaps"]),
                  internal_errors=d["internal_errors"], cadence=cadence_from_dict(d["cadence"]))
    return trace, d


def embedded_priors(doc: dict, source: str = "<dict>") -> Any:
    """The ``Priors`` a checked session document carries or refers to (None: none named, the
    family's shipped priors).

    A reference to a family's shipped priors (version 5) gives the installed shipped priors,
    their source labelled ``"<family>.json (shipped, <fingerprint prefix>)"``. When the installed
    file's fingerprint differs from the one recorded (a session written by another version),
    the session still loads with the installed file, and a warning names the session, the
    family and both fingerprints: the answers may differ from the writer's.
    A version-1 session names a prior *path*; it is never followed (a session must answer the
    same on every machine): a warning is logged and the shipped priors of its family are used.
    ``load_session(path, priors=...)`` or ``neuraldbg explain --priors`` override. Priors written
    for another network (another fingerprint) are fitted to this one: its outdated tables are
    replaced by this version's hand-set ones, with a warning naming them.
    """
    from neuraldbg.causal.priors import for_network, validate

    block = doc.get("priors")
    if block is None:
        return None
    if isinstance(block, str):
        log.warning("neuraldbg: %s (session version 1) names the prior file %s, which is not opened; using "
                    "the shipped %s priors (pass priors= or --priors to use that file)",
                    source, block, doc.get("family"))
        return None
    if "shipped" in block:
        return _shipped_priors(doc, block, source)
    # the very same content as one validated before (compared as JSON text: 1, 1.0 and true
    # differ there, as they do for the checks) need not be validated again
    text = json.dumps(block["content"], sort_keys=True)
    hit = _embedded_cache.get(block["fingerprint"])
    if hit is not None and hit[0] == text:
        return dataclasses.replace(hit[1], source=block["source"] + _EMBEDDED)
    content, replaced = for_network(block["content"])
    pri = validate(content, source=source, error=SessionFormatError, prefix="priors.content")
    if replaced:  # written for another network: its other tables still hold
        log.warning("neuraldbg: %s embeds priors written for another version of the network; %s no longer fit "
                    "it and are replaced by this version's defaults", source, ", ".join(replaced))
        return dataclasses.replace(pri, source=block["source"] + _EMBEDDED)
    if pri.fingerprint != block["fingerprint"]:
        raise SessionFormatError(f"{source}: priors.fingerprint: {block['fingerprint']} does not match the "
                                 f"embedded priors ({pri.fingerprint}); the priors were edited", file=source,
                                 field="priors.fingerprint")
    if len(_embedded_cache) >= 64:
        _embedded_cache.clear()
    _embedded_cache[pri.fingerprint] = (text, pri)
    return dataclasses.replace(pri, source=block["source"] + _EMBEDDED)


def _shipped_priors(doc: dict, ref: dict, source: str) -> Any:
    """The installed shipped priors a reference names, labelled with their fingerprint."""
    from neuraldbg import __version__
    from neuraldbg.causal.priors import load_priors

    family, written = ref["shipped"], ref["fingerprint"]
    pri = load_priors(family=family)
    label = f"{family}.json (shipped, {pri.fingerprint[:12]})"
    if pri.fingerprint != written:
        # another version's shipped file: refusing the session would lose its whole trace, and
        # the writer's priors are nowhere to be had, so the installed ones answer, said loudly
        log.warning("neuraldbg: %s was diagnosed with the shipped %s priors of fingerprint %s (neuraldbg %s); "
                    "this NeuralDBG (%s) ships %s priors of fingerprint %s, which are used instead: the "
                    "answers may differ from the writer's (pass priors= or --priors to use other priors)",
                    source, family, written, doc.get("neuraldbg_version"), __version__, family, pri.fingerprint)
        label = f"{family}.json (shipped, {pri.fingerprint[:12]}; the session names {written[:12]})"
    return dataclasses.replace(pri, source=label)


def export_trace(trace: Trace, path, *, config: dict | None = None, priors: Any = None) -> str:
    """Write ``trace`` to ``path`` atomically; returns the path as a string."""
    return write_json_atomic(path, trace_to_dict(trace, config=config, priors=priors))


class Session(CausalQueries):
    """A session read back from disk: the same queries as the live monitor, offline.

    ``priors`` is the ``Priors`` the queries use; by default the ones ``doc`` embeds or refers
    to (:func:`embedded_priors`). ``session.priors.source`` and ``.fingerprint`` name them.
    """

    def __init__(self, trace: Trace, doc: dict | None = None, path: str | None = None, priors: Any = None) -> None:
        self._trace = trace
        self.doc = doc or {}
        self.path = path
        self.family = trace.family
        if priors is None and isinstance(self.doc.get("priors"), dict):
            priors = embedded_priors(self.doc, path or "<session>")
        from neuraldbg.causal.priors import as_priors

        self._priors = as_priors(priors, trace.family)

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
        """Write this session again (e.g. after merging), with its priors; returns the path."""
        return export_trace(self._trace, path, config=self.doc.get("config"), priors=self._priors)

    def __repr__(self) -> str:
        return f"Session(family={self.family!r}, events={len(self._trace.events)}, path={self.path!r})"


def save_session(session: Any, path) -> str:
    """Write a live monitor's or a loaded session's trace to ``path`` (the plain-named twin of
    ``export_aquarium_package``); returns the path."""
    return session.export_aquarium_package(path)


def load_session(path, priors: Any = None) -> Session:
    """Read a session written by ``export_aquarium_package``.

    Its queries use the priors the file embeds, or the installed shipped priors it refers to
    (with a warning when their fingerprint differs from the recorded one), unless ``priors``
    (a prior file path or a ``Priors``) overrides them. A missing or unreadable file raises ``OSError``
    (``FileNotFoundError``, ``PermissionError``, ...); any file that is not a valid session
    raises :class:`~neuraldbg.schema.SessionFormatError` (a ``ValueError``) naming the file
    and the field. Nothing named inside the file is ever opened.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no session file at {p}")
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a directory, not a session file")
    trace, doc = trace_from_dict(read_json(p, SessionFormatError, "NeuralDBG session"), source=str(p))
    if priors is None:
        priors = embedded_priors(doc, str(p))
    return Session(trace, doc, str(p), priors=priors)


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
