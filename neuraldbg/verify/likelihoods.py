"""The interventional likelihoods and the posterior update they make.

Each tested hypothesis adds one observed node ``verify:<cause>/<state>`` to the network,
with states ``persisted`` / ``vanished`` and the root causes as parents:

    P(vanished | do(cause = ok), roots) = p[test][label]    for a single abnormal root,
                                        = p[test]["healthy"] when every root is ok,
                                        = min over the abnormal roots otherwise

(with two faults present, fixing one leaves the other's symptom unless this intervention
happens to undo both). Given the roots, the outcome depends on nothing else, so the update
multiplies the observational posterior over the root joint states by one likelihood
column per test and renormalizes; :func:`reference_update` computes the same with pgmpy's
``VariableElimination`` on the network extended by those nodes (the cross-check of the tests).

The tables live in ``neuraldbg/priors/verification.json``: a hand-set table (its reasoning
next to it) and, when fitted from benchmark runs (:mod:`neuraldbg.verify.tune`), Beta-smoothed
tables per family, with ``default`` for families without enough runs.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from neuraldbg.verify.outcome import OUTCOMES, RULE, VANISHED_IMPROVEMENT
from neuraldbg.vocab import ABNORMAL_LABELS, HEALTHY, LABELS, ROOT_NAMES, ROOTS

SCHEMA_VERSION = 1
_KEYS = {"schema_version", "description", "outcome", "hand_set", "reasoning", "fitted", "counts", "provenance"}

Table = Mapping[str, Mapping[str, float]]  # test label -> truth label -> P(vanished)

#: Abnormal states no replay can test: a ``detach`` or ``no_grad`` inside the model's own
#: forward cannot be undone from outside it; the dtype of the weights and of the optimizer's
#: arithmetic (``numerics``) is set by the user's code around the model (inputs cast to it,
#: autocast regions, the optimizer's ``eps``), which a replay cannot change from outside without
#: breaking it; and the leak ``unexplained`` has nothing to undo.
UNTESTED: tuple[str, ...] = ("training_loop/graph_detached", "numerics/overflow", "numerics/updates_lost",
                             "unexplained/not_learning")
#: The rows of a likelihood table: one per abnormal state an intervention tests.
TESTED_LABELS: tuple[str, ...] = tuple(lab for lab in ABNORMAL_LABELS if lab not in UNTESTED)


class LikelihoodError(ValueError):
    """A verification likelihood file is invalid."""


def _check_table(where: str, table: Any) -> dict[str, dict[str, float]]:
    if not isinstance(table, Mapping) or set(table) != set(TESTED_LABELS):
        raise LikelihoodError(f"{where}: expected one row per tested abnormal state {list(TESTED_LABELS)}")
    out = {}
    for test, row in table.items():
        if not isinstance(row, Mapping) or set(row) != set(LABELS):
            raise LikelihoodError(f"{where}.{test}: expected one probability per label {list(LABELS)}")
        for label, p in row.items():
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
                raise LikelihoodError(f"{where}.{test}.{label}: expected a probability in (0, 1), got {p!r}")
        out[test] = {lab: float(row[lab]) for lab in LABELS}
    return out


def validate(data: Any, source: str = "<dict>") -> dict[str, Any]:
    """Check a parsed likelihood file; ``LikelihoodError`` names the field and what is valid."""
    if not isinstance(data, Mapping):
        raise LikelihoodError(f"{source}: expected a JSON object")
    unknown = set(data) - _KEYS
    if unknown:
        raise LikelihoodError(f"{source}: unknown keys {sorted(unknown)}; valid: {sorted(_KEYS)}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise LikelihoodError(f"{source}: schema_version {data.get('schema_version')!r} is not {SCHEMA_VERSION}")
    out = dict(data)
    outcome = data.get("outcome") or {}
    thr = outcome.get("vanished_improvement")
    if thr != VANISHED_IMPROVEMENT:
        raise LikelihoodError(f"{source}: outcome.vanished_improvement is {thr!r}, but outcomes are decided at "
                              f"{VANISHED_IMPROVEMENT} (neuraldbg/verify/outcome.py): refit the tables")
    if outcome.get("rule") != RULE:
        raise LikelihoodError(f"{source}: outcome.rule is {outcome.get('rule')!r}, but outcomes are decided by "
                              f"{RULE!r} (neuraldbg/verify/outcome.py): refit the tables on runs of this version")
    out["hand_set"] = _check_table(f"{source}: hand_set", data.get("hand_set"))
    fitted = data.get("fitted") or {}
    if not isinstance(fitted, Mapping):
        raise LikelihoodError(f"{source}: fitted must map a family (or 'default') to a table")
    out["fitted"] = {fam: _check_table(f"{source}: fitted.{fam}", t) for fam, t in fitted.items()}
    return out


def shipped_path() -> Path:
    """The shipped file, ``neuraldbg/priors/verification.json``."""
    return Path(str(resources.files("neuraldbg.priors").joinpath("verification.json")))


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise LikelihoodError(f"{path}: cannot read a likelihood file ({exc})") from None
    return validate(data, path)


def load(path: str | Path | None = None) -> dict[str, Any]:
    """The validated likelihood file (the shipped one by default); cached per modification time."""
    p = Path(path) if path is not None else shipped_path()
    try:
        mtime = p.stat().st_mtime
    except OSError as exc:
        raise LikelihoodError(f"{p}: cannot read a likelihood file ({exc})") from None
    return _load(str(p), mtime)


def table_for(family: str | None, data: Mapping[str, Any] | None = None) -> dict[str, dict[str, float]]:
    """The table a family's runs use: fitted for that family, else fitted ``default``, else hand-set."""
    data = load() if data is None else data
    fitted = data.get("fitted") or {}
    return fitted.get(family) or fitted.get("default") or data["hand_set"]


def label(cause: str, state: str) -> str:
    """The ``cause/state`` label of an abnormal root state."""
    return f"{cause}/{state}"


# ---------------------------------------------------------------------------- the update

def _root_labels() -> list[list[str]]:
    """For every root joint index (the compiled network's order), its abnormal labels."""
    cards = [len(ROOTS[v]) for v in ROOT_NAMES]
    out = []
    for idx in range(int(np.prod(cards))):
        states = np.unravel_index(idx, cards)
        out.append([label(v, ROOTS[v][s]) for v, s in zip(ROOT_NAMES, states) if s != 0])
    return out


_ROOT_LABELS = _root_labels()


def likelihood(table: Table, test: str, outcome: str) -> np.ndarray:
    """``P(outcome | do(test = ok), root joint)`` for every root joint state."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; valid: {', '.join(OUTCOMES)}")
    row = table[test]
    p = np.array([min(row[lab] for lab in labs) if labs else row[HEALTHY] for labs in _ROOT_LABELS])
    return p if outcome == "vanished" else 1.0 - p


def update(joint: np.ndarray, tests: Iterable[tuple[str, str]], table: Table) -> np.ndarray:
    """The root joint posterior after observing ``(test label, outcome)`` pairs (normalized)."""
    out = np.asarray(joint, dtype=float).copy()
    for test, outcome in tests:
        out *= likelihood(table, test, outcome)
    total = out.sum()
    if not total > 0 or not math.isfinite(total):
        raise ValueError("the verification outcomes have zero probability under the model")
    return out / total


def marginals(joint: np.ndarray) -> tuple[dict[str, dict[str, float]], float]:
    """Root marginals and ``P(healthy)`` of a root joint distribution."""
    cards = [len(ROOTS[v]) for v in ROOT_NAMES]
    grid = np.asarray(joint, dtype=float).reshape(cards)
    marg = {}
    for i, v in enumerate(ROOT_NAMES):
        axes = tuple(j for j in range(len(cards)) if j != i)
        m = grid.sum(axis=axes)
        marg[v] = {s: float(x) for s, x in zip(ROOTS[v], m)}
    return marg, float(grid.reshape(-1)[0])


def reference_update(cpds: Mapping[str, Any], evidence: Mapping[str, str], tests: Sequence[tuple[str, str]],
                     table: Table) -> tuple[dict[str, dict[str, float]], float]:
    """Root marginals and ``P(healthy)`` by pgmpy ``VariableElimination`` on the network with
    one ``verify:`` node per test (slow; the cross-check of :func:`update`). ``evidence`` holds
    single states only."""
    from neuraldbg.causal.network import _pgmpy, build_model
    from neuraldbg.causal.structure import default_network

    _, TabularCPD, VariableElimination = _pgmpy()
    model = build_model(cpds, default_network())
    roots = sorted(ROOTS)
    cards = [len(ROOTS[v]) for v in roots]
    ev = dict(evidence)
    for i, (test, outcome) in enumerate(tests):
        node = f"verify{i}:{test}"
        p = likelihood(table, test, "vanished")  # root joint order == sorted roots, row-major
        model.add_node(node)
        model.add_edges_from([(r, node) for r in roots])
        model.add_cpds(TabularCPD(node, 2, np.vstack([1 - p, p]), evidence=roots, evidence_card=cards,
                                 state_names={node: list(OUTCOMES), **{r: list(ROOTS[r]) for r in roots}}))
        ev[node] = outcome
    model.check_model()
    infer = VariableElimination(model)
    joint = infer.query(roots, evidence=ev, joint=True, show_progress=False)
    joint.normalize()
    marg = {}
    for v in roots:
        f = joint.marginalize([r for r in roots if r != v], inplace=False)
        marg[v] = {s: float(f.get_value(**{v: s})) for s in ROOTS[v]}
    return marg, float(joint.get_value(**{v: "ok" for v in roots}))
