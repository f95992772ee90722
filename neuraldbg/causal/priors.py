"""Family priors: load and validate prior files (``neuraldbg/priors/<family>.json`` or a tuned file).

Schema (version 1)::

    {
      "schema_version": 1,
      "family": "mlp",                      # one of FAMILIES
      "description": "...",                 # optional
      "provenance": {"method": "hand-set", ...},   # optional: who/what produced the numbers
      "roots": {"learning_rate": {"ok": 0.9, "too_high": 0.06, "too_low": 0.04}, ...},
      "reasoning": {"learning_rate": "why these numbers", ...},   # optional
      "temperature": 1.0,                   # optional, > 0: divides the evidence log-likelihood
      "cpds": {                             # optional: fitted tables replacing hand-set ones
        "exploding": {"parents": ["data", "instability"], "states": ["absent", "later", "init"],
                      "values": [[...], [...], [...]]}   # pgmpy layout, parents sorted
      }
    }

Every violation raises :class:`PriorError` naming the file, the field and what is valid.
Loading is cached (per family; per path, size and modification time).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from neuraldbg.causal.structure import NODE_BY_NAME, states_of
from neuraldbg.vocab import DEFAULT_FAMILY, FAMILIES, ROOTS

log = logging.getLogger("neuraldbg")

#: Prior-file schema this version reads and writes.
SCHEMA_VERSION = 1
#: Tolerance on sums in a file; the values are then renormalized exactly.
FILE_SUM_TOL = 1e-6

_TOP_KEYS = {"schema_version", "family", "description", "provenance", "roots", "reasoning",
             "temperature", "cpds"}


class PriorError(ValueError):
    """A prior file is missing, unreadable or invalid."""


@dataclass(frozen=True, eq=False)
class Priors:
    """A validated prior source: root priors, optional fitted CPDs and temperature."""

    family: str
    roots: Mapping[str, Mapping[str, float]]
    source: str
    cpds: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    temperature: float = 1.0
    provenance: Mapping[str, Any] = field(default_factory=dict)
    reasoning: Mapping[str, str] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    fingerprint: str = ""

    def p_healthy(self) -> float:
        """Prior probability that every root cause is ``ok``."""
        return math.prod(d["ok"] for d in self.roots.values())

    def to_dict(self) -> dict[str, Any]:
        """The file form (what :func:`validate` reads back)."""
        d: dict[str, Any] = {"schema_version": self.schema_version, "family": self.family,
                             "provenance": dict(self.provenance),
                             "roots": {v: dict(s) for v, s in self.roots.items()},
                             "reasoning": dict(self.reasoning), "temperature": self.temperature}
        if self.cpds:
            d["cpds"] = {k: dict(v) for k, v in self.cpds.items()}
        return d


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.12g}")
    if isinstance(x, Mapping):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def _fail(where: str, msg: str) -> PriorError:
    return PriorError(f"{where}: {msg}")


def _number(where: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise _fail(where, f"expected a finite number, got {x!r}")
    return float(x)


def validate(data: Any, source: str = "<dict>", family: str | None = None) -> Priors:
    """Check a parsed prior file and return :class:`Priors`; raise :class:`PriorError`."""
    if not isinstance(data, Mapping):
        raise _fail(source, f"expected a JSON object at top level, got {type(data).__name__}")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise _fail(source, f"unknown keys {sorted(unknown)}; valid: {sorted(_TOP_KEYS)}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _fail(source, f"schema_version {version!r} is not supported; this neuraldbg reads "
                            f"schema_version {SCHEMA_VERSION}")
    fam = data.get("family")
    if fam not in FAMILIES:
        raise _fail(source, f"family {fam!r} is not valid; valid: {', '.join(FAMILIES)}")
    if family is not None and fam != family:
        raise _fail(source, f"file is for family {fam!r}, expected {family!r}")

    roots_in = data.get("roots")
    if not isinstance(roots_in, Mapping):
        raise _fail(source, "missing 'roots' object (variable -> {state: probability})")
    missing, extra = set(ROOTS) - set(roots_in), set(roots_in) - set(ROOTS)
    if missing or extra:
        raise _fail(source, f"roots must name exactly {sorted(ROOTS)}; "
                            f"missing {sorted(missing)}, unknown {sorted(extra)}")
    roots: dict[str, dict[str, float]] = {}
    for var, states in ROOTS.items():
        dist = roots_in[var]
        where = f"{source}: roots.{var}"
        if not isinstance(dist, Mapping):
            raise PriorError(f"{where}: expected an object state -> probability")
        if set(dist) != set(states):
            raise PriorError(f"{where}: states {sorted(dist)} are not valid; valid: {list(states)}")
        vals = {s: _number(f"{where}.{s}", dist[s]) for s in states}
        for s, p in vals.items():
            if not 0 < p < 1:
                raise PriorError(f"{where}.{s}: probability {p} must be strictly between 0 and 1 "
                                 "(a zero prior makes that state impossible whatever the evidence)")
        total = sum(vals.values())
        if abs(total - 1) > FILE_SUM_TOL:
            raise PriorError(f"{where}: probabilities sum to {total:.9g}, not 1")
        roots[var] = {s: p / total for s, p in vals.items()}

    temperature = _number(f"{source}: temperature", data.get("temperature", 1.0))
    if temperature <= 0:
        raise _fail(source, f"temperature must be > 0, got {temperature}")

    cpds = _validate_cpds(data.get("cpds", {}) or {}, source)
    prov = data.get("provenance", {}) or {}
    if not isinstance(prov, Mapping):
        raise _fail(source, "provenance must be an object")
    reasoning = data.get("reasoning", {}) or {}
    if not isinstance(reasoning, Mapping):
        raise _fail(source, "reasoning must be an object variable -> text")

    # rounded: renormalizing columns on every load moves the last bits, and a file must keep
    # its fingerprint through a to_dict()/validate() round trip
    canon = json.dumps(_rounded({"roots": roots, "cpds": cpds, "temperature": temperature}), sort_keys=True)
    return Priors(family=fam, roots=roots, source=source, cpds=cpds, temperature=temperature,
                  provenance=dict(prov), reasoning=dict(reasoning), schema_version=version,
                  fingerprint=hashlib.sha1(canon.encode()).hexdigest())


def _validate_cpds(cpds_in: Any, source: str) -> dict[str, dict[str, Any]]:
    if not isinstance(cpds_in, Mapping):
        raise _fail(source, "cpds must be an object node -> table")
    out = {}
    for node, spec in cpds_in.items():
        where = f"{source}: cpds.{node}"
        if node not in NODE_BY_NAME:
            raise PriorError(f"{where}: no such non-root node; valid: {', '.join(NODE_BY_NAME)}")
        decl = NODE_BY_NAME[node]
        if not isinstance(spec, Mapping) or "values" not in spec:
            raise PriorError(f"{where}: expected an object with 'parents', 'states' and 'values'")
        parents = list(spec.get("parents", decl.parents))
        if parents != list(decl.parents):
            raise PriorError(f"{where}: parents {parents} must be {list(decl.parents)} (sorted)")
        states = list(spec.get("states", decl.states))
        if states != list(decl.states):
            raise PriorError(f"{where}: states {states} must be {list(decl.states)}")
        n_cols = math.prod(len(states_of(p)) for p in parents)
        rows = spec["values"]
        if (not isinstance(rows, list) or len(rows) != len(states)
                or any(not isinstance(r, list) or len(r) != n_cols for r in rows)):
            raise PriorError(f"{where}: values must be a {len(states)} x {n_cols} list of lists "
                             "(rows: states; columns: parent configurations, last parent fastest)")
        vals = [[_number(f"{where}.values[{i}][{j}]", x) for j, x in enumerate(r)] for i, r in enumerate(rows)]
        fixed = [[0.0] * n_cols for _ in states]
        for j in range(n_cols):
            col = [vals[i][j] for i in range(len(states))]
            if min(col) < 0:
                raise PriorError(f"{where}: column {j} has a negative probability")
            total = sum(col)
            if abs(total - 1) > FILE_SUM_TOL:
                raise PriorError(f"{where}: column {j} sums to {total:.9g}, not 1")
            for i in range(len(states)):
                fixed[i][j] = col[i] / total
        out[node] = {"parents": parents, "states": states, "values": fixed}
    return out


def read(path: str | os.PathLike, family: str | None = None) -> Priors:
    """Read and validate one prior file (no cache)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PriorError(f"{p}: prior file not found") from None
    except OSError as exc:
        raise PriorError(f"{p}: cannot read prior file ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PriorError(f"{p}: not valid JSON ({exc})") from None
    return validate(data, source=str(p), family=family)


_family_cache: dict[str, Priors] = {}
_path_cache: dict[tuple[str, int, int], Priors] = {}


def load_priors(family: str | None = None, path: str | os.PathLike | None = None) -> Priors:
    """The validated priors of ``family`` (shipped file), or of the file at ``path``.

    ``path`` wins when both are given (a warning is logged if the file's family differs);
    with neither, the :data:`DEFAULT_FAMILY` priors are used. Raises :class:`PriorError`
    (a ``ValueError``) for an unknown family or an invalid file.
    """
    if path is not None:
        real = os.path.realpath(os.fspath(path))
        try:
            st = os.stat(real)
        except OSError:
            raise PriorError(f"{path}: prior file not found") from None
        key = (real, st.st_mtime_ns, st.st_size)
        pri = _path_cache.get(key)
        if pri is None:
            pri = read(real)
            _path_cache[key] = pri
        if family is not None and family != pri.family:
            log.warning("prior file %s is for family %r, used for a %r run", path, pri.family, family)
        return pri
    fam = DEFAULT_FAMILY if family is None else family
    if fam not in FAMILIES:
        raise PriorError(f"unknown family {fam!r}; valid: {', '.join(FAMILIES)}")
    pri = _family_cache.get(fam)
    if pri is None:
        res = resources.files("neuraldbg.priors").joinpath(f"{fam}.json")
        try:
            text = res.read_text(encoding="utf-8")
        except (FileNotFoundError, OSError):
            raise PriorError(f"shipped prior file for family {fam!r} is missing ({res})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PriorError(f"{res}: not valid JSON ({exc})") from None
        pri = validate(data, source=f"{fam}.json", family=fam)
        _family_cache[fam] = pri
    return pri
