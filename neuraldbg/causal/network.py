"""The network as a pgmpy ``DiscreteBayesianNetwork``: to construct, check and cross-check.

pgmpy takes seconds to import, so it is imported inside these functions only; the query
path (:mod:`.compiled`) never needs it. The model built here is the reference the compiled
enumeration is tested against (``VariableElimination``), and the object the prior-tuning
step fits (latent nodes are declared as ``latents``; parents are in sorted order, see
upstream pgmpy bug report 3521).
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Mapping

import numpy as np

from neuraldbg.causal.cpd import Cpd, strict_check
from neuraldbg.causal.structure import Network

log = logging.getLogger("neuraldbg")


def _pgmpy() -> tuple[Any, Any, Any]:
    """(DiscreteBayesianNetwork, TabularCPD, VariableElimination), FutureWarnings silenced."""
    with warnings.catch_warnings():
        # pgmpy 1.x warns about deprecated estimator names on import; not ours to fix
        warnings.simplefilter("ignore", FutureWarning)
        from pgmpy.factors.discrete import TabularCPD
        from pgmpy.inference import VariableElimination
        from pgmpy.models import DiscreteBayesianNetwork
    return DiscreteBayesianNetwork, TabularCPD, VariableElimination


def to_tabular(cpd: Cpd, network: Network) -> Any:
    """A pgmpy ``TabularCPD`` with state names, parents in sorted order."""
    _, TabularCPD, _ = _pgmpy()
    names = {cpd.name: list(cpd.states)}
    names.update({p: list(network.states_of(p)) for p in cpd.parents})
    if not cpd.parents:
        return TabularCPD(cpd.name, len(cpd.states), cpd.values.reshape(-1, 1), state_names=names)
    return TabularCPD(cpd.name, len(cpd.states), cpd.values_2d,
                      evidence=list(cpd.parents), evidence_card=[len(network.states_of(p)) for p in cpd.parents],
                      state_names=names)


def build_model(cpds: Mapping[str, Cpd], network: Network) -> Any:
    """The checked pgmpy model of ``network``: ``check_model()`` plus the strict 1e-9 column-sum check."""
    DiscreteBayesianNetwork, _, _ = _pgmpy()
    strict_check(cpds)
    model = DiscreteBayesianNetwork(network.edges(), latents=set(network.latent_names))
    model.add_nodes_from(network.roots)  # roots are in the edge list already; harmless, explicit
    model.add_cpds(*[to_tabular(c, network) for c in cpds.values()])
    model.check_model()
    for tab in model.get_cpds():  # pgmpy's check tolerates 0.01; ours does not
        vals = tab.get_values()
        dev = float(np.abs(vals.sum(axis=0) - 1.0).max())
        if dev > 1e-9:
            raise ValueError(f"pgmpy CPD of {tab.variable!r}: column sum off by {dev:.3g}")
        if list(tab.variables[1:]) != sorted(tab.variables[1:]):
            raise ValueError(f"pgmpy CPD of {tab.variable!r}: parents not sorted {tab.variables[1:]}")
    return model


def reference_posterior(model: Any, evidence: Mapping[str, str],
                        network: Network) -> tuple[dict[str, dict[str, float]], float]:
    """Root marginals and ``P(healthy)`` by pgmpy ``VariableElimination`` (slow; for tests)."""
    _, _, VariableElimination = _pgmpy()
    infer = VariableElimination(model)
    ev = dict(evidence)
    roots = list(network.root_names)
    joint = infer.query(roots, evidence=ev or None, joint=True, show_progress=False)
    marg: dict[str, dict[str, float]] = {}
    for v in roots:
        f = joint.marginalize([r for r in roots if r != v], inplace=False)
        f.normalize()
        marg[v] = {s: float(f.get_value(**{v: s})) for s in network.roots[v]}
    joint.normalize()
    p_ok = float(joint.get_value(**{v: "ok" for v in roots}))
    return marg, p_ok


def cpds_from_model(model: Any, network: Network) -> dict[str, dict[str, Any]]:
    """A prior file's ``cpds`` section from a (fitted) pgmpy model: every non-root node's
    table in pgmpy layout, with its sorted parents and states, ready to be validated."""
    out = {}
    for tab in model.get_cpds():
        if tab.variable in network.roots:
            continue
        parents = list(tab.variables[1:])
        order = sorted(parents)
        if parents != order:  # re-order columns into sorted-parent layout
            tab = tab.copy()
            tab.reorder_parents(order)
        out[tab.variable] = {
            "parents": order,
            "states": list(tab.state_names[tab.variable]),
            "values": tab.get_values().tolist(),
        }
    return out
