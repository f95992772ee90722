"""CPD tables as numpy arrays, built from a :class:`~.structure.Network`'s declarations.

Every table has shape ``(child_card, *parent_cards)`` with parents in sorted order; reshaped
to 2-d in C order it is exactly pgmpy's ``TabularCPD`` layout (rows are child states,
columns run over parent configurations with the last parent varying fastest). No pgmpy
here: this module is shared by the compiled engine (hot path) and the pgmpy builder.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from neuraldbg.causal.structure import Network, NoisyMax, Table

#: Largest tolerated deviation of a CPD column sum from 1 (pgmpy's own check allows 0.01).
STRICT_TOL = 1e-9


@dataclass(frozen=True)
class Cpd:
    """One conditional table: ``values[child_state, parent_1_state, ...]``."""

    name: str
    states: tuple[str, ...]
    parents: tuple[str, ...]
    values: np.ndarray

    @property
    def values_2d(self) -> np.ndarray:
        """pgmpy layout: ``(child_card, prod(parent_cards))``."""
        return self.values.reshape(len(self.states), -1)


def noisy_max_values(node: NoisyMax, network: Network) -> np.ndarray:
    """Table of a leaky noisy-MAX node.

    For each parent configuration the CDF over the ordered child states is the product of
    the leak's CDF and each parent state's CDF; the table is the CDF's differences.
    """
    card = len(node.states)
    idx = {s: i for i, s in enumerate(node.states)}

    def cdf(dist: Mapping[str, float]) -> np.ndarray:
        pmf = np.zeros(card)
        for s, p in dist.items():
            pmf[idx[s]] = p
        pmf[0] = 1.0 - pmf[1:].sum()
        return np.cumsum(pmf)

    leak_cdf = cdf(node.leak)
    parent_states = [network.states_of(p) for p in node.parents]
    effects = {tuple(k.split("=", 1)): cdf(v) for k, v in node.effects.items()}
    out = np.empty((card,) + tuple(len(s) for s in parent_states))
    for combo in itertools.product(*[range(len(s)) for s in parent_states]):
        f = leak_cdf.copy()
        for parent, states, i in zip(node.parents, parent_states, combo):
            eff = effects.get((parent, states[i]))
            if eff is not None:
                f = f * eff
        f[-1] = 1.0  # every CDF ends at exactly 1; avoid rounding drift
        out[(slice(None),) + combo] = np.diff(f, prepend=0.0)
    return out


def table_values(node: Table, network: Network) -> np.ndarray:
    """Table of a :class:`~.structure.Table` node: first matching row per configuration."""
    parent_states = [network.states_of(p) for p in node.parents]
    out = np.empty((len(node.states),) + tuple(len(s) for s in parent_states))
    for combo in itertools.product(*[range(len(s)) for s in parent_states]):
        assign = {p: states[i] for p, states, i in zip(node.parents, parent_states, combo)}
        for pattern, col in node.rows:
            if all(assign[p] == s for p, s in pattern.items()):
                out[(slice(None),) + combo] = col
                break
        else:  # pragma: no cover - structure declares a catch-all row
            raise ValueError(f"{node.name}: no row matches {assign}")
    return out


def default_cpds(network: Network) -> dict[str, Cpd]:
    """The hand-set CPDs of every non-root node of ``network`` (a new dict of shared, read-only
    tables: built once per network, which is immutable, since every prior file, fit and query
    starts from them)."""
    cached = network.__dict__.get("_default_cpds")
    if cached is None:
        cached = {}
        for node in network.nodes:
            vals = noisy_max_values(node, network) if isinstance(node, NoisyMax) else table_values(node, network)
            vals.flags.writeable = False
            cached[node.name] = Cpd(node.name, node.states, node.parents, vals)
        network.__dict__["_default_cpds"] = cached
    return dict(cached)


def build_cpds(roots: Mapping[str, Mapping[str, float]], overrides: Mapping[str, Mapping] | None,
               network: Network) -> dict[str, Cpd]:
    """All CPDs of ``network``: root priors from ``roots``, others hand-set unless ``overrides`` has them.

    ``overrides`` maps a node to ``{"values": 2-d list in pgmpy layout, ...}`` (a prior
    file's validated ``cpds`` section).
    """
    cpds: dict[str, Cpd] = {}
    for name, states in network.roots.items():
        cpds[name] = Cpd(name, states, (), np.array([float(roots[name][s]) for s in states]))
    for name, cpd in default_cpds(network).items():
        if overrides and name in overrides:
            vals = np.asarray(overrides[name]["values"], dtype=float)
            vals = vals.reshape((len(cpd.states),) + tuple(len(network.states_of(p)) for p in cpd.parents))
            cpd = Cpd(name, cpd.states, cpd.parents, vals)
        cpds[name] = cpd
    strict_check(cpds)
    return cpds


def strict_check(cpds: Mapping[str, Cpd], tol: float = STRICT_TOL) -> None:
    """Raise ``ValueError`` unless every column is a distribution to within ``tol``."""
    for name, cpd in cpds.items():
        v = cpd.values_2d
        if not np.all(np.isfinite(v)) or (v < 0).any():
            raise ValueError(f"CPD of {name!r} has negative or non-finite entries")
        dev = np.abs(v.sum(axis=0) - 1.0).max()
        if dev > tol:
            raise ValueError(f"CPD of {name!r}: a column sums to 1 {'+-'} {dev:.3g} (tolerance {tol})")
