"""Family priors: load and validate prior files (``neuraldbg/priors/<family>.json`` or a tuned file).

Schema (version 2)::

    {
      "schema_version": 2,
      "family": "mlp",                      # one of FAMILIES
      "network": "9f1c...",                 # fingerprint of the network it was written for
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

Every violation raises :class:`PriorError` naming the file, the field and what is valid; the
checks live in :mod:`neuraldbg.schema`, shared with session files. A file written for another
network (another fingerprint, or none) is refused, naming both fingerprints. Loading is cached (per
family; per path, size and modification time).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from neuraldbg.causal.structure import Network, default_network
from neuraldbg.schema import (FILE_SUM_TOL, PRIOR_SCHEMA_VERSION, Checker, PriorError, SchemaError,  # noqa: F401
                              check_priors, read_json)
from neuraldbg.vocab import DEFAULT_FAMILY, FAMILIES

log = logging.getLogger("neuraldbg")

#: Prior-file schema this version reads and writes.
SCHEMA_VERSION = PRIOR_SCHEMA_VERSION
__all__ = ["FILE_SUM_TOL", "PriorError", "Priors", "SCHEMA_VERSION", "as_priors", "load_priors", "read",
           "validate"]


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
    #: fingerprint of the network these priors are for (:attr:`Network.fingerprint`)
    network: str = ""
    #: read from the package's own file for ``family`` (:func:`load_priors` without a path):
    #: a session refers to such priors by family and fingerprint instead of embedding them. A
    #: user's copy of that file, even an identical one, is not: it is their pinned choice
    shipped: bool = False

    def p_healthy(self) -> float:
        """Prior probability that every root cause is ``ok``."""
        return math.prod(d["ok"] for d in self.roots.values())

    def to_dict(self) -> dict[str, Any]:
        """The file form (what :func:`validate` reads back)."""
        d: dict[str, Any] = {"schema_version": self.schema_version, "family": self.family,
                             "network": self.network, "provenance": dict(self.provenance),
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


def validate(data: Any, source: str = "<dict>", family: str | None = None, *, network: Network | None = None,
             error: type[SchemaError] = PriorError, prefix: str = "") -> Priors:
    """Check a parsed prior file for ``network`` (default: this version's) and return
    :class:`Priors`; raise :class:`PriorError`.

    The checks are :func:`neuraldbg.schema.check_priors` (the file must record ``network``'s
    fingerprint) plus one that needs the whole network: every state of every non-root node
    must be possible under the priors. ``error`` and ``prefix`` report the fields of priors
    embedded in a larger document.
    """
    net = network if network is not None else default_network()
    d = check_priors(data, source, family, nodes=net.node_by_name, states_of=net.states_of, roots_of=net.roots,
                     network=net.fingerprint, error=error, prefix=prefix)
    _check_possible(d["roots"], d["cpds"], net, Checker(source, error, prefix))
    # rounded: renormalizing columns on every load moves the last bits, and a file must keep
    # its fingerprint through a to_dict()/validate() round trip
    canon = json.dumps(_rounded({"roots": d["roots"], "cpds": d["cpds"], "temperature": d["temperature"]}),
                       sort_keys=True)
    return Priors(family=d["family"], roots=d["roots"], source=source, cpds=d["cpds"],
                  temperature=d["temperature"], provenance=d["provenance"], reasoning=d["reasoning"],
                  schema_version=d["schema_version"], fingerprint=hashlib.sha1(canon.encode()).hexdigest(),
                  network=net.fingerprint)


def _check_possible(roots: Mapping, cpds: Mapping, network: Network, c: Checker) -> None:
    """A state whose every supporting parent configuration has prior probability 0 (through
    the latent mechanisms) would make any run that shows it "impossible evidence"."""
    import numpy as np

    from neuraldbg.causal.compiled import CompiledNetwork
    from neuraldbg.causal.cpd import build_cpds

    net = CompiledNetwork(build_cpds(roots, cpds, network), network)
    for v in network.latent_names:
        for i, s in enumerate(net.states[v]):
            if not np.isfinite(net.log_prior[net.index[v] == i]).any():
                raise c.fail(f"cpds.{v}", f"state {s!r} of {v} has probability 0 under the priors")
    for e, table in zip(network.evidence_names, net.log_tables):
        best = np.max(net.log_prior[:, None] + table[:, :-1], axis=0)
        for s, b in zip(net.states[e], best):
            if not np.isfinite(b):
                raise c.fail(f"cpds.{e}", f"state {s!r} of {e} has probability 0 under the priors (it is "
                                          "possible only where its parents' states are impossible)")


def for_network(content: Any, network: Network | None = None) -> tuple[Any, list[str]]:
    """A prior document written for another network (an embedded one, from an older session)
    made fit for ``network`` (default: this version's), and the parts replaced.

    Tables whose node the network lacks, or declares with other parents or states, are dropped
    (the network's hand-set tables stand in); root priors of roots added since are taken from
    the family's shipped priors; the fingerprint becomes ``network``'s. A document that records
    ``network``'s fingerprint is returned as it is. Only sessions do this, with a warning: a
    prior *file* for another network is refused (:func:`validate`).
    """
    net = network if network is not None else default_network()
    if not isinstance(content, dict) or content.get("network") == net.fingerprint:
        return content, []
    replaced: list[str] = []
    cpds = content.get("cpds")
    if isinstance(cpds, dict):
        keep = {}
        for name, spec in cpds.items():
            node = net.node_by_name.get(name)
            fits = node is not None and isinstance(spec, dict) and \
                list(spec.get("parents", node.parents)) == list(node.parents) and \
                list(spec.get("states", node.states)) == list(node.states)
            if fits:
                keep[name] = spec
            else:
                replaced.append(f"the table of {name}")
        cpds = keep
    roots = content.get("roots")
    if isinstance(roots, dict) and set(roots) != set(net.roots):
        family = content.get("family")
        shipped = load_priors(family=family if family in FAMILIES else None).roots
        new = [v for v in net.roots if v not in roots]
        replaced += [f"the prior of {v}" for v in new] + [f"the prior of {v} (no longer a root)"
                                                          for v in roots if v not in net.roots]
        roots = {v: (roots[v] if v in roots else dict(shipped[v])) for v in net.roots}
    out = {**content, "schema_version": SCHEMA_VERSION, "network": net.fingerprint}
    if isinstance(cpds, dict):
        out["cpds"] = cpds
    if isinstance(roots, dict):
        out["roots"] = roots
    return out, replaced


def read(path: str | os.PathLike, family: str | None = None) -> Priors:
    """Read and validate one prior file (no cache)."""
    p = Path(path)
    try:
        data = read_json(p, PriorError, "prior file")
    except FileNotFoundError:
        raise PriorError(f"{p}: prior file not found", file=str(p)) from None
    except OSError as exc:
        raise PriorError(f"{p}: cannot read prior file ({exc})", file=str(p)) from None
    return validate(data, source=str(p), family=family)


def as_priors(priors: Any, family: str | None = None) -> Priors | None:
    """A monitor's ``priors=`` argument checked now: a path is read and validated (so a typo
    fails at construction, not at the first query hours later), a :class:`Priors` is kept,
    ``None`` stays None (the family's shipped priors)."""
    if priors is None or isinstance(priors, Priors):
        return priors
    if isinstance(priors, (str, os.PathLike)):
        return load_priors(family=family, path=priors)
    raise TypeError(f"priors must be a path, a Priors or None, got {type(priors).__name__}")


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
            pri = read(path)
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
        pri = dataclasses.replace(validate(data, source=f"{fam}.json", family=fam), shipped=True)
        _family_cache[fam] = pri
    return pri
