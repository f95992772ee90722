"""The causal network as a value: node types, and :class:`Network`, which checks and indexes them.

Three kinds of node (``docs/causal_model.md`` draws the network and gives the reasoning):

* **roots** -- the root-cause variables of ``docs/api.md`` (:data:`neuraldbg.vocab.ROOTS`); their
  priors come from the family's prior file (``neuraldbg/priors/<family>.json``), never from here;
* **latents** -- mechanism nodes that are never observed (``instability``, ``signal_decay``,
  ``corruption``):
  correlated symptoms hang off a mechanism, so a burst of them counts as one piece of evidence;
* **evidence** -- discretized readings of a :class:`~neuraldbg.trace.Trace`. Each evidence node
  owns its extractor (``extract(view) -> Reading | None``), declared next to it in
  ``neuraldbg/causal/nodes/``, together with the signatures it reads.

CPDs are parametrized as **leaky noisy-MAX** (:class:`NoisyMax`: noisy-OR generalized to ordered
states): every active parent state acting alone would move the child to state ``s`` with
probability ``effects[...][s]`` (else leave it normal), a leak stands for every cause not in the
model, and the observed state is the maximum over parents and leak:
``P(Y <= y | parents) = F_leak(y) * prod_i F_i(y | x_i)``. Nodes whose states are not ordered by
severity are plain tables (:class:`Table`) with one row per parent pattern.

Parents are always kept in sorted order (pgmpy's ``fit_update`` mis-aligns columns otherwise,
upstream pgmpy bug report 3521), and every CPD can be replaced by a fitted table from a prior
file's ``cpds`` section. A network's :attr:`Network.fingerprint` (its nodes, parents and states)
is what prior and session files record, so a file written for another network is recognized.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from neuraldbg.events.base import Event
from neuraldbg.vocab import ROOT_NAMES, ROOTS  # noqa: F401  (re-exported: the network's roots)


@dataclass(frozen=True)
class Reading:
    """What one evidence node read from a trace.

    ``state`` is a state, a tuple of states (a partial observation: "one of these") or ``None``
    (unobserved: the trace could not show it, ``reason`` says why; ``gap`` when the monitor did
    not measure it). ``support`` holds the events behind the reading, ``note`` a short sentence.
    """

    state: str | tuple[str, ...] | None
    support: tuple[Event, ...] = ()
    note: str = ""
    reason: str | None = None
    #: unobserved because the monitor did not measure what it reads (no optimizer found, not at
    #: initialization, an unsupported tensor type, a monitor error), not because the run did not
    #: show it: the diagnosis says so
    gap: bool = False


#: an evidence node's extractor: a view of the trace in, a reading (``None``: unobserved) out
Extractor = Callable[[Any], "Reading | None"]


@dataclass(frozen=True)
class Precondition:
    """A root state that is possible only where the run has what it needs.

    ``lacks(view)`` returns why the run lacks it (the state then has probability 0 in the
    posterior, whatever else the run shows), or ``None`` when it has it or cannot tell: an
    unknown precondition never rules a state out. ``needs`` says what in a few words. Declared
    in a node module's ``PRECONDITIONS``, next to the evidence the state produces.
    """

    cause: str
    state: str
    needs: str
    lacks: Callable[[Any], "str | None"]
    why: str = ""

    def __post_init__(self) -> None:
        if self.state not in ROOTS.get(self.cause, ())[1:]:
            raise ValueError(f"a precondition names an abnormal root state; {self.cause}={self.state} is none")


@dataclass(frozen=True)
class NoisyMax:
    """A leaky noisy-MAX node.

    ``states`` run from the normal state (index 0) to the highest precedence; ``leak`` maps
    non-normal states to their leak probabilities; ``effects`` maps ``"parent=state"`` to the
    distribution (over non-normal child states) that parent state would cause on its own.
    Parents are the variables named in ``effects``, sorted. ``extract``: the evidence node's
    extractor (``None`` for a latent node).
    """

    name: str
    states: tuple[str, ...]
    leak: Mapping[str, float]
    effects: Mapping[str, Mapping[str, float]]
    latent: bool = False
    why: str = ""
    extract: Extractor | None = field(default=None, compare=False, repr=False)

    @property
    def parents(self) -> tuple[str, ...]:
        """Parent variables, sorted."""
        return tuple(sorted({k.split("=", 1)[0] for k in self.effects}))


@dataclass(frozen=True)
class Table:
    """A node given by explicit rows: the first row whose pattern matches a parent
    configuration gives the column (a distribution over ``states``); ``{}`` matches all."""

    name: str
    states: tuple[str, ...]
    parents: tuple[str, ...]
    rows: tuple[tuple[Mapping[str, str], tuple[float, ...]], ...]
    latent: bool = False
    why: str = ""
    extract: Extractor | None = field(default=None, compare=False, repr=False)


Node = NoisyMax | Table


class Network:
    """The network: roots (from the vocabulary), then latent nodes, then evidence nodes.

    Checked on construction (parents sorted and declared before their children, effects and
    rows valid distributions, one extractor per evidence node, no latent with one) and
    immutable after. Everything that works on the network -- CPD tables, the compiled
    inference, the pgmpy model, the prior fitter and the prior validation -- takes it as an
    argument.
    """

    def __init__(self, nodes: Iterable[Node], roots: Mapping[str, tuple[str, ...]] = ROOTS) -> None:
        nodes = tuple(nodes)
        self.roots: Mapping[str, tuple[str, ...]] = roots
        self.root_names: tuple[str, ...] = tuple(sorted(roots))
        self.nodes: tuple[Node, ...] = tuple(n for n in nodes if n.latent) + tuple(n for n in nodes if not n.latent)
        self.node_by_name: dict[str, Node] = {}
        for n in self.nodes:
            if n.name in self.node_by_name or n.name in roots:
                raise ValueError(f"node {n.name!r} is declared twice")
            self.node_by_name[n.name] = n
        self.latent_names: tuple[str, ...] = tuple(n.name for n in self.nodes if n.latent)
        self.evidence_names: tuple[str, ...] = tuple(n.name for n in self.nodes if not n.latent)
        self._check()
        shape = [[v, list(roots[v]), []] for v in self.root_names]
        shape += [[n.name, list(n.states), list(n.parents)] for n in sorted(self.nodes, key=lambda n: n.name)]
        #: sha1 of every variable's name, states and parents: what files record
        self.fingerprint: str = hashlib.sha1(json.dumps(shape).encode()).hexdigest()

    def states_of(self, name: str) -> tuple[str, ...]:
        """States of any variable of the network (root, latent or evidence)."""
        if name in self.roots:
            return tuple(self.roots[name])
        node = self.node_by_name.get(name)
        if node is None:
            raise KeyError(f"unknown variable {name!r}; valid: {', '.join(self.all_variables())}")
        return node.states

    def parents_of(self, name: str) -> tuple[str, ...]:
        """Sorted parents of a variable (roots have none)."""
        if name in self.roots:
            return ()
        self.states_of(name)  # raises a KeyError naming the valid variables
        return self.node_by_name[name].parents

    def all_variables(self) -> tuple[str, ...]:
        """Every variable: roots, then latents, then evidence, each in declaration order."""
        return self.root_names + self.latent_names + self.evidence_names

    def edges(self) -> list[tuple[str, str]]:
        """Directed edges ``(parent, child)`` of the network."""
        return [(p, n.name) for n in self.nodes for p in n.parents]

    def __repr__(self) -> str:
        return (f"Network({len(self.roots)} roots, {len(self.latent_names)} latents, "
                f"{len(self.evidence_names)} evidence, {self.fingerprint[:8]})")

    def _check(self) -> None:
        known = set(self.roots)
        for node in self.nodes:
            if list(node.parents) != sorted(node.parents):
                raise ValueError(f"{node.name}: parents must be sorted, got {node.parents}")
            for p in node.parents:
                if p not in known:
                    raise ValueError(f"{node.name}: parent {p!r} is declared after it or unknown")
            if node.latent == (node.extract is not None):
                raise ValueError(f"{node.name}: an evidence node needs an extractor, a latent node has none")
            if isinstance(node, NoisyMax):
                for key, dist in node.effects.items():
                    parent, _, pstate = key.partition("=")
                    if pstate not in self.states_of(parent) or pstate == self.states_of(parent)[0]:
                        raise ValueError(f"{node.name}: effect {key!r} names no abnormal state")
                    bad = set(dist) - set(node.states[1:])
                    if bad or not 0 <= sum(dist.values()) < 1:
                        raise ValueError(f"{node.name}: effect {key!r} is not a sub-distribution")
                if set(node.leak) - set(node.states[1:]) or not 0 < sum(node.leak.values()) < 1:
                    raise ValueError(f"{node.name}: bad leak {dict(node.leak)}")
            else:
                for pattern, col in node.rows:
                    if len(col) != len(node.states) or abs(sum(col) - 1) > 1e-12:
                        raise ValueError(f"{node.name}: row {pattern} is not a distribution")
                    for p, s in pattern.items():
                        if p not in node.parents or s not in self.states_of(p):
                            raise ValueError(f"{node.name}: row pattern {pattern} is invalid")
            known.add(node.name)


_DEFAULT: list[Network] = []


def default_network() -> Network:
    """The network this version of NeuralDBG diagnoses with: every node of
    ``neuraldbg/causal/nodes/`` (built once)."""
    if not _DEFAULT:
        from neuraldbg.causal.nodes import nodes

        _DEFAULT.append(Network(nodes()))
    return _DEFAULT[0]
