"""The session schema (``docs/session_format.md``)."""
from __future__ import annotations

from typing import Any, Callable

from neuraldbg.schema.base import MAX_INT, SESSION_SCHEMA, SESSION_VERSIONS, Checker, SessionFormatError, join, show
from neuraldbg.vocab import EVENT_KINDS, EVENT_TYPES, FAMILIES

_REQUIRED = ("schema", "version", "neuraldbg_version", "family", "rank", "world_size", "steps",
             "model", "events", "loss", "config", "priors")
#: where each version keeps its signatures (before version 3: a flat ``meta`` object)
_SIGNATURES_KEY = {1: "meta", 2: "meta", 3: "signatures", 4: "signatures", 5: "signatures", 6: "signatures"}
#: fields added by version 4: why a signature was not measured, and the monitor's own failures
_V4 = ("gaps", "internal_errors")
_EVENT_OPTIONAL = ("layer", "end_step", "count", "severity", "values", "rank")
_LOSS_KEYS = ("n", "first", "last", "min", "n_nonfinite", "first_nonfinite_step", "history")
#: the fields of version 6's optional ``cadence`` (``neuraldbg.trace.CadenceRecord``)
_CADENCE_REQUIRED = ("every", "changes")
_CADENCE_OPTIONAL = ("budget", "alarms", "changes_omitted", "alarms_omitted")

#: ``check(name, value) -> value``: a declared signature's value normalized, ``KeyError`` for an
#: undeclared name, ``ValueError`` for a bad value (the causal engine's table hands it in)
SignatureCheck = Callable[[str, Any], Any]


def check_session(doc: Any, file: str = "<dict>", *, signature: SignatureCheck | None = None,
                  renamed: dict[str, str] | None = None) -> dict:
    """Validate a parsed session document; return it normalized (see ``docs/session_format.md``).

    The result holds the same keys with numbers decoded, every event field filled in,
    ``priors`` either None, a path string (version 1, never opened), the embedded block
    ``{"source", "fingerprint", "content"}`` or (from version 5) the reference to a family's
    shipped priors ``{"shipped": family, "fingerprint"}``, ``signatures`` as
    ``{name: (value, step or None)}``, and ``cadence`` (from version 6, optional) as
    ``{"every", "budget", "changes", "alarms", "changes_omitted", "alarms_omitted"}`` with
    lists of tuples, or None. ``signature`` checks each signature
    against its declaration (an undeclared one is refused); ``renamed`` maps names older
    versions wrote to their current name.
    """
    c = Checker(file)
    if not isinstance(doc, dict) or doc.get("schema") != SESSION_SCHEMA:
        raise SessionFormatError(f"{file} is not a NeuralDBG session (expected schema {SESSION_SCHEMA!r})",
                                 file=file)
    version = doc.get("version")
    if type(version) is not int or version not in SESSION_VERSIONS:
        raise SessionFormatError(f"{file} has session schema version {version!r}; this NeuralDBG reads "
                                 f"versions {', '.join(map(str, SESSION_VERSIONS))}", file=file, field="version")
    sig_key = _SIGNATURES_KEY[version]
    c.obj(doc, "", _REQUIRED + (sig_key,) + (_V4 if version >= 4 else ()),
          ("propagation",) + (("cadence",) if version >= 6 else ()))
    out: dict[str, Any] = {"schema": SESSION_SCHEMA, "version": version,
                           "neuraldbg_version": c.string(doc["neuraldbg_version"], "neuraldbg_version"),
                           "family": c.string(doc["family"], "family", FAMILIES),
                           "rank": c.integer(doc["rank"], "rank", 0, null=True),
                           "world_size": c.integer(doc["world_size"], "world_size", 1, null=True)}
    steps = c.obj(doc["steps"], "steps", ("first", "last"))
    first = c.integer(steps["first"], "steps.first")
    out["steps"] = {"first": first, "last": c.integer(steps["last"], "steps.last", first)}
    model = c.obj(doc["model"], "model", ("layers",))
    out["model"] = {"layers": _layers(c, model["layers"])}
    out["events"] = [_event(c, e, join("events", i)) for i, e in enumerate(c.array(doc["events"], "events"))]
    if "propagation" in doc:
        for i, p in enumerate(c.array(doc["propagation"], "propagation")):
            _propagation(c, p, join("propagation", i))
    out["loss"] = _loss(c, doc["loss"])
    out["config"] = _config(c, doc["config"])
    out["cadence"] = _cadence(c, doc["cadence"]) if "cadence" in doc else None
    out["signatures"] = _signatures(c, doc[sig_key], sig_key, version, signature, renamed or {})
    out["gaps"], out["internal_errors"] = {}, 0
    if version >= 4:
        gaps = c.obj(doc["gaps"], "gaps")
        for k, why in gaps.items():
            if signature is not None:
                try:
                    signature(k, None)
                except KeyError as exc:
                    raise c.fail(join("gaps", k), str(exc.args[0] if exc.args else exc)) from None
                except ValueError:
                    pass  # only the name is checked here: a gap has no value
            out["gaps"][k] = c.string(why, join("gaps", k))
        out["internal_errors"] = c.integer(doc["internal_errors"], "internal_errors", 0)
    pri = doc["priors"]
    if version == 1:
        out["priors"] = c.string(pri, "priors", null=True)
    elif pri is None:  # none embedded: the family's shipped priors (a trace sent between ranks)
        out["priors"] = None
    elif version >= 5 and isinstance(pri, dict) and "shipped" in pri:
        # the package's own file, named rather than copied: which file and which content
        ref = c.obj(pri, "priors", ("shipped", "fingerprint"))
        out["priors"] = {"shipped": c.string(ref["shipped"], "priors.shipped", FAMILIES),
                         "fingerprint": _fingerprint(c, ref["fingerprint"])}
    else:
        if version >= 5 and isinstance(pri, dict) and "content" not in pri:
            raise c.fail("priors", "expected a reference to the shipped priors {shipped, fingerprint}, "
                                   "embedded priors {source, fingerprint, content}, or null")
        block = c.obj(pri, "priors", ("source", "fingerprint", "content"))
        c.string(block["source"], "priors.source")
        fp = _fingerprint(c, block["fingerprint"])
        out["priors"] = {"source": block["source"], "fingerprint": fp, "content": block["content"]}
    return out


def _fingerprint(c: Checker, fp: Any) -> str:
    """A prior fingerprint: 40 lowercase hex digits (a SHA-1)."""
    fp = c.string(fp, "priors.fingerprint")
    if len(fp) != 40 or any(ch not in "0123456789abcdef" for ch in fp):
        raise c.fail("priors.fingerprint", f"{show(fp)} is not valid; valid: 40 lowercase hex digits")
    return fp


def _layers(c: Checker, layers: Any) -> list[dict]:
    out, seen = [], set()
    for i, l in enumerate(c.array(layers, "model.layers")):
        path = join("model.layers", i)
        c.obj(l, path, ("name", "type", "index"), ("n_params", "role"))
        name = c.string(l["name"], join(path, "name"))
        if name in seen:
            raise c.fail(join(path, "name"), f"layer {show(name)} is listed twice; layer names are unique")
        seen.add(name)
        out.append({"name": name, "type": c.string(l["type"], join(path, "type")),
                    "index": c.integer(l["index"], join(path, "index"), 0),
                    "n_params": c.integer(l.get("n_params", 0), join(path, "n_params"), 0),
                    "role": c.string(l.get("role", ""), join(path, "role"), ("", "norm", "attn_qk"))})
    return out


def _event(c: Checker, e: Any, path: str) -> dict:
    c.obj(e, path, ("type", "kind", "step"), _EVENT_OPTIONAL)
    etype = c.string(e["type"], join(path, "type"), EVENT_TYPES)
    kind = c.string(e["kind"], join(path, "kind"), EVENT_KINDS[etype])
    step = c.integer(e["step"], join(path, "step"))
    end = c.integer(e.get("end_step", step), join(path, "end_step"), step)
    values = c.obj(e.get("values", {}), join(path, "values"))
    return {"type": etype, "kind": kind, "layer": c.string(e.get("layer"), join(path, "layer"), null=True),
            "step": step, "end_step": end, "count": c.integer(e.get("count", 1), join(path, "count"), 1),
            "severity": c.number(e.get("severity", 0.0), join(path, "severity")),
            "values": {k: c.number(v, join(join(path, "values"), k)) for k, v in values.items()},
            "rank": c.integer(e.get("rank"), join(path, "rank"), 0, null=True)}


def _propagation(c: Checker, p: Any, path: str) -> None:
    # derived from the events and recomputed on read; checked so that no field goes unread
    c.obj(p, path, ("type", "kind", "first", "order"))
    c.string(p["type"], join(path, "type"), EVENT_TYPES)
    c.string(p["kind"], join(path, "kind"))
    _event(c, p["first"], join(path, "first"))
    for i, o in enumerate(c.array(p["order"], join(path, "order"))):
        where = join(join(path, "order"), i)
        layer, step = c.array(o, where, 2)
        c.string(layer, join(where, 0), null=True)
        c.integer(step, join(where, 1))


def _loss(c: Checker, lo: Any) -> dict:
    c.obj(lo, "loss", (), _LOSS_KEYS)
    n = c.integer(lo.get("n", 0), "loss.n", 0)
    out = {"n": n, "first": c.number(lo.get("first"), "loss.first", null=True),
           "last": c.number(lo.get("last"), "loss.last", null=True),
           "min": c.number(lo.get("min"), "loss.min", finite=True, null=True),
           "n_nonfinite": c.integer(lo.get("n_nonfinite", 0), "loss.n_nonfinite", 0, n),
           "first_nonfinite_step": c.integer(lo.get("first_nonfinite_step"), "loss.first_nonfinite_step", null=True)}
    hist = []
    for i, pt in enumerate(c.array(lo.get("history", []), "loss.history")):
        where = join("loss.history", i)
        s, v = c.array(pt, where, 2)
        hist.append((c.integer(s, join(where, 0)), c.number(v, join(where, 1))))
    out["history"] = hist
    return out


def _cadence(c: Checker, cad: Any) -> dict:
    """The monitor's cadence: the setting, the budget, the interval from each step on (in step
    order), the anomalies that made it dense again."""
    c.obj(cad, "cadence", _CADENCE_REQUIRED, _CADENCE_OPTIONAL)
    every = cad["every"]
    if every != "auto":
        if type(every) is not int or not 1 <= every <= MAX_INT:
            raise c.fail("cadence.every", f"{show(every)} is not valid; valid: an integer >= 1 or \"auto\"")
    budget = c.number(cad.get("budget"), "cadence.budget", finite=True, null=True)
    if budget is not None and not 0 < budget < 1:
        raise c.fail("cadence.budget", f"{budget!r} is out of range; valid: a number in (0, 1) or null")
    changes, last = [], None
    for i, ch in enumerate(c.array(cad["changes"], "cadence.changes")):
        where = join("cadence.changes", i)
        step, n = c.array(ch, where, 2)
        step = c.integer(step, join(where, 0))
        if last is not None and step < last:
            raise c.fail(join(where, 0), f"step {step} comes before the previous change's {last}; changes are in "
                                         "step order")
        last = step
        changes.append((step, c.integer(n, join(where, 1), 1)))
    alarms = []
    for i, a in enumerate(c.array(cad.get("alarms", []), "cadence.alarms")):
        where = join("cadence.alarms", i)
        step, at, why = c.array(a, where, 3)
        alarms.append((c.integer(step, join(where, 0)), c.integer(at, join(where, 1)), c.string(why, join(where, 2))))
    return {"every": every, "budget": budget, "changes": changes, "alarms": alarms,
            "changes_omitted": c.integer(cad.get("changes_omitted", 0), "cadence.changes_omitted", 0),
            "alarms_omitted": c.integer(cad.get("alarms_omitted", 0), "cadence.alarms_omitted", 0)}


def _config(c: Checker, cfg: Any) -> dict:
    from neuraldbg.config import DetectorConfig

    c.obj(cfg, "config")
    if not cfg:
        return {}
    defaults = DetectorConfig().to_dict()
    c.obj(cfg, "config", (), tuple(defaults))
    out = {}
    for k, v in cfg.items():
        d, where = defaults[k], join("config", k)
        if isinstance(d, list):
            out[k] = [c.string(x, join(where, i)) for i, x in enumerate(c.array(v, where))]
        elif isinstance(d, bool):
            if not isinstance(v, bool):
                raise c.fail(where, f"expected true or false, got {show(v)}")
            out[k] = v
        elif isinstance(d, int):
            out[k] = c.integer(v, where)
        else:
            out[k] = c.number(v, where)
    try:
        DetectorConfig.from_dict(out)
    except (TypeError, ValueError) as exc:
        raise c.fail("config", str(exc)) from None
    return out


def _signatures(c: Checker, sigs: Any, key: str, version: int, check: SignatureCheck | None,
                renamed: dict[str, str]) -> dict[str, tuple[Any, int | None]]:
    """``{name: (value, step)}``: version 3 stores ``{"value", "step"}`` per signature, older
    versions a bare value (no step)."""
    c.obj(sigs, key)
    out: dict[str, tuple[Any, int | None]] = {}
    for k, v in sigs.items():
        where = join(key, k)
        step = None
        if version >= 3:
            c.obj(v, where, ("value",), ("step",))
            step = c.integer(v.get("step"), join(where, "step"), null=True)
            v = v["value"]
        v = [c.scalar(x, join(where, i)) for i, x in enumerate(v)] if isinstance(v, list) else c.scalar(v, where)
        name = renamed.get(k, k) if version < 3 else k
        if check is not None:
            try:
                v = check(name, v)
            except KeyError as exc:
                raise c.fail(where, str(exc.args[0] if exc.args else exc)) from None
            except ValueError as exc:
                raise c.fail(where, str(exc)) from None
        out[name] = (v, step)
    return out
