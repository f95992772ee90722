"""The prior-file schema (``docs/priors.md``)."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from neuraldbg.schema.base import FILE_SUM_TOL, PRIOR_SCHEMA_VERSION, Checker, PriorError, SchemaError, join, show
from neuraldbg.vocab import FAMILIES, ROOTS

PRIOR_KEYS = ("schema_version", "family", "network", "description", "provenance", "roots", "reasoning",
              "temperature", "cpds")


def network_mismatch(found: Any, expected: str) -> str:
    """The one message for a file written for another network than this version's."""
    was = f"network {found}" if isinstance(found, str) else "a network it does not record (an older file)"
    return (f"written for {was}; this NeuralDBG diagnoses with network {expected} (nodes, parents or states "
            "differ): refit it with `neuraldbg tune-priors`, or start from a shipped prior file")


def check_priors(data: Any, file: str = "<dict>", family: str | None = None, *,
                 nodes: Mapping[str, Any], states_of: Callable[[str], tuple[str, ...]],
                 roots_of: Mapping[str, tuple[str, ...]] = ROOTS, network: str | None = None,
                 error: type[SchemaError] = PriorError, prefix: str = "") -> dict:
    """Validate a parsed prior file (``docs/priors.md``); return its normalized parts.

    ``nodes`` maps each non-root node of the network to its declaration (``parents``,
    ``states``), ``states_of`` gives any variable's states, ``roots_of`` the roots and
    ``network`` the network's fingerprint (the causal engine hands them in, so the schema does
    not depend on it). A file written for another network is refused, naming both
    fingerprints. The result has ``schema_version``, ``family``, ``network``, ``roots`` and
    ``cpds`` (renormalized), ``temperature``, ``provenance`` and ``reasoning``.
    ``family``, when given, must match the file's. ``prefix`` places the fields inside a larger
    document (a session's embedded priors).
    """
    c = Checker(file, error, prefix)
    if not isinstance(data, dict):
        raise c.fail("", f"expected a JSON object at top level, got {show(data)}")
    unknown = sorted(set(data) - set(PRIOR_KEYS))
    if unknown:
        raise c.fail("", f"unknown keys {unknown}; valid: {sorted(PRIOR_KEYS)}")
    version, found = data.get("schema_version"), data.get("network")
    if network is not None and found != network:
        raise c.fail("network", network_mismatch(found, network))
    if type(version) is not int or version != PRIOR_SCHEMA_VERSION:
        raise c.fail("schema_version", f"schema_version {version!r} is not supported; this neuraldbg reads "
                                       f"schema_version {PRIOR_SCHEMA_VERSION}")
    if found is not None and not (isinstance(found, str) and len(found) == 40
                                  and all(ch in "0123456789abcdef" for ch in found)):
        raise c.fail("network", f"{show(found)} is not a network fingerprint; valid: 40 lowercase hex digits")
    fam = data.get("family")
    if fam not in FAMILIES:
        raise c.fail("family", f"family {fam!r} is not valid; valid: {', '.join(FAMILIES)}")
    if family is not None and fam != family:
        raise c.fail("family", f"file is for family {fam!r}, expected {family!r}")
    roots_in = data.get("roots")
    if not isinstance(roots_in, dict):
        raise c.fail("", "missing 'roots' object (variable -> {state: probability})")
    missing, extra = set(roots_of) - set(roots_in), set(roots_in) - set(roots_of)
    if missing or extra:
        raise c.fail("roots", f"roots must name exactly {sorted(roots_of)}; missing {sorted(missing)}, "
                              f"unknown {sorted(extra)}")
    roots: dict[str, dict[str, float]] = {}
    for var, states in roots_of.items():
        where = join("roots", var)
        dist = c.obj(roots_in[var], where)
        if set(dist) != set(states):
            raise c.fail(where, f"states {sorted(dist)} are not valid; valid: {list(states)}")
        vals = {s: c.number(dist[s], join(where, s), finite=True) for s in states}
        for s, p in vals.items():
            if not 0 < p < 1:
                raise c.fail(join(where, s), f"probability {p} must be strictly between 0 and 1 "
                                             "(a zero prior makes that state impossible whatever the evidence)")
        total = math.fsum(vals.values())
        if abs(total - 1) > FILE_SUM_TOL:
            raise c.fail(where, f"probabilities sum to {total:.9g}, not 1")
        roots[var] = {s: p / total for s, p in vals.items()}
    temperature = c.number(data.get("temperature", 1.0), "temperature", finite=True)
    if temperature <= 0:
        raise c.fail("temperature", f"temperature must be > 0, got {temperature}")
    cpds_in = data.get("cpds", {}) or {}
    c.obj(cpds_in, "cpds")
    cpds = {node: _cpd(c, node, spec, nodes, states_of) for node, spec in cpds_in.items()}
    prov = data.get("provenance", {}) or {}
    if not isinstance(prov, dict):
        raise c.fail("provenance", "provenance must be an object")
    reasoning = data.get("reasoning", {}) or {}
    if not isinstance(reasoning, dict):
        raise c.fail("reasoning", "reasoning must be an object variable -> text")
    for k, v in reasoning.items():
        c.string(v, join("reasoning", k))
    if "description" in data:
        c.string(data["description"], "description")
    return {"schema_version": version, "family": fam, "network": found, "roots": roots, "cpds": cpds,
            "temperature": temperature,
            "provenance": dict(prov), "reasoning": dict(reasoning)}


def _cpd(c: Checker, node: str, spec: Any, decls: Mapping[str, Any],
         states_of: Callable[[str], tuple[str, ...]]) -> dict:
    where = join("cpds", node)
    if node not in decls:
        raise c.fail(where, f"no such non-root node; valid: {', '.join(decls)}")
    decl = decls[node]
    if not isinstance(spec, dict) or "values" not in spec:
        raise c.fail(where, "expected an object with 'parents', 'states' and 'values'")
    c.obj(spec, where, ("values",), ("parents", "states"))
    parents = spec.get("parents", list(decl.parents))
    if parents != list(decl.parents):
        raise c.fail(join(where, "parents"), f"parents {parents} must be {list(decl.parents)} (sorted)")
    states = spec.get("states", list(decl.states))
    if states != list(decl.states):
        raise c.fail(join(where, "states"), f"states {states} must be {list(decl.states)}")
    n_cols = math.prod(len(states_of(p)) for p in parents)
    rows = spec["values"]
    if (not isinstance(rows, list) or len(rows) != len(states)
            or any(not isinstance(r, list) or len(r) != n_cols for r in rows)):
        raise c.fail(where, f"values must be a {len(states)} x {n_cols} list of lists "
                                            "(rows: states; columns: parent configurations, last parent fastest)")
    vals = [[c.number(x, f"{where}.values[{i}][{j}]", finite=True) for j, x in enumerate(r)]
            for i, r in enumerate(rows)]
    fixed = [[0.0] * n_cols for _ in states]
    for j in range(n_cols):
        col = [vals[i][j] for i in range(len(states))]
        if min(col) < 0:
            raise c.fail(where, f"column {j} has a negative probability")
        total = math.fsum(col)
        if abs(total - 1) > FILE_SUM_TOL:
            raise c.fail(where, f"column {j} sums to {total:.9g}, not 1")
        for i in range(len(states)):
            fixed[i][j] = col[i] / total
    for i, s in enumerate(states):
        if not any(fixed[i]):
            raise c.fail(f"{where}.values[{i}]", f"state {s!r} has probability 0 under every parent "
                                                 "configuration, so observing it would be impossible evidence; "
                                                 "give it a small positive probability")
    return {"parents": list(parents), "states": list(states), "values": fixed}
