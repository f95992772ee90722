"""The causal network, declared in one place: nodes, states, parents and CPD parameters.

Read this file top to bottom to know the whole model (``docs/causal_model.md`` draws it and
gives the reasoning behind every number). Three kinds of node:

* **roots** -- the four root-cause variables of ``docs/api.md`` (:data:`neuraldbg.vocab.ROOTS`); their priors come from the family's
  prior file (``neuraldbg/priors/<family>.json``), never from here;
* **latents** -- mechanism nodes that are never observed: ``instability`` (the run blows up,
  either from the first step or during training) and ``signal_decay`` (signal shrinks
  through depth, or uniformly in every layer). Correlated symptoms hang off a mechanism, so
  a burst of spike + divergence + NaN loss + exploding gradients counts as *one* piece of
  evidence for "something made the run unstable", not four independent ones;
* **evidence** -- discretized features of a :class:`~neuraldbg.trace.Trace`
  (``neuraldbg.causal.evidence`` computes them, with documented cut points).

CPDs are parametrized as **leaky noisy-MAX** (noisy-OR generalized to ordered states): each
node's states are listed from "normal" to the most severe/earliest; every active parent
state acting alone would move the child to state ``s`` with probability ``effects[...][s]``
(else leave it normal), a leak stands for every cause not in the model, and the observed
state is the maximum over parents and leak:
``P(Y <= y | parents) = F_leak(y) * prod_i F_i(y | x_i)``. With two states this is exactly
the leaky noisy-OR. The few nodes whose states are not ordered by severity (``depth_risk``,
``order``) are plain tables with one row per parent pattern.

Parents are always kept in sorted order (pgmpy's ``fit_update`` mis-aligns columns
otherwise, upstream pgmpy bug report 3521), and every CPD can be replaced by a fitted table from a prior
file's ``cpds`` section (same node, same sorted parents, same states), which is how the
prior-tuning step will re-fit them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from neuraldbg.vocab import ROOT_NAMES, ROOTS  # noqa: F401  (re-exported: the network's roots)


@dataclass(frozen=True)
class NoisyMax:
    """A leaky noisy-MAX node.

    ``states`` run from the normal state (index 0) to the highest precedence; ``leak`` maps
    non-normal states to their leak probabilities; ``effects`` maps ``"parent=state"`` to the
    distribution (over non-normal child states) that parent state would cause on its own.
    Parents are the variables named in ``effects``, sorted.
    """

    name: str
    states: tuple[str, ...]
    leak: Mapping[str, float]
    effects: Mapping[str, Mapping[str, float]]
    latent: bool = False
    why: str = ""

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


Node = NoisyMax | Table

# ---------------------------------------------------------------------------------------
# The network. Numbers are hand-set; docs/causal_model.md gives the reasoning for each.
# ---------------------------------------------------------------------------------------
NODES: tuple[Node, ...] = (
    # ---- latent mechanisms ----------------------------------------------------------
    NoisyMax(
        "instability", ("none", "training", "init"), latent=True,
        leak={"training": 0.01, "init": 0.002},
        effects={
            "learning_rate=too_high": {"training": 0.92},
            "initialization=too_large": {"init": 0.80, "training": 0.10},
            "data=shifted": {"training": 0.55},
            "data=corrupted": {"training": 0.10},
            "architecture=unstable": {"training": 0.25, "init": 0.08},
        },
        why="Numerical blow-up. 'init': present from the first step, before any update could "
            "cause it (only weights, inputs and depth act then). 'training': appears after "
            "updates (step size) or after the inputs change.",
    ),
    NoisyMax(
        "signal_decay", ("none", "depth", "uniform"), latent=True,
        leak={"depth": 0.01, "uniform": 0.005},
        effects={
            "architecture=unstable": {"depth": 0.75},
            "initialization=too_small": {"uniform": 0.85, "depth": 0.05},
        },
        why="Signal too small to learn from. 'depth': the gradient shrinks layer by layer "
            "toward the input (saturating stacks, deep plain nets). 'uniform': every layer's "
            "signal is small because every weight is small.",
    ),
    # ---- evidence -------------------------------------------------------------------
    NoisyMax(
        "exploding", ("absent", "later", "init"),
        leak={"later": 0.02, "init": 0.005},
        effects={
            "instability=training": {"later": 0.75, "init": 0.02},
            "instability=init": {"init": 0.75, "later": 0.15},
            "data=corrupted": {"later": 0.40},
        },
        why="First exploding-gradient event, by onset phase. Non-finite gradients from a "
            "NaN batch also read as exploding, hence the direct edge from data=corrupted.",
    ),
    NoisyMax(
        "vanishing", ("absent", "later", "init_depth", "init_uniform"),
        leak={"later": 0.03, "init_depth": 0.01, "init_uniform": 0.005},
        effects={
            "signal_decay=depth": {"init_depth": 0.70, "init_uniform": 0.03, "later": 0.10},
            "signal_decay=uniform": {"init_uniform": 0.45, "init_depth": 0.35, "later": 0.05},
            "instability=training": {"later": 0.25},
            "instability=init": {"later": 0.20},
        },
        why="First vanishing-gradient events, by onset phase and by what the forward signal "
            "does at onset: 'init_depth' when layer outputs keep a normal scale (only the "
            "backward signal decays through depth), 'init_uniform' when the outputs are tiny "
            "too (every weight is small; biases often keep outputs normal, hence the weight of "
            "'init_depth' under 'uniform'). Units killed by a blow-up stop gradients ('later').",
    ),
    NoisyMax(
        "saturation", ("absent", "later", "init", "init_vanishing"),
        leak={"later": 0.03, "init": 0.01, "init_vanishing": 0.003},
        effects={
            "signal_decay=depth": {"init_vanishing": 0.45, "init": 0.10},
            "initialization=too_large": {"init": 0.45},
            "instability=init": {"init": 0.30, "init_vanishing": 0.10},
            "instability=training": {"later": 0.35},
            "data=shifted": {"later": 0.30},
        },
        why="Bounded activations (sigmoid, tanh, softmax) pinned at their bounds, by onset: "
            "from the first step (weights or depth), with vanishing gradients in the same or "
            "an adjacent layer (the deep-sigmoid signature), or only after updates / an input "
            "change ('later': e.g. attention collapse under a too-large step size). Weights too "
            "large push pre-activations into the tails from step 0 whether or not anything "
            "blows up (query/key weights too large: one-hot attention rows), hence the direct "
            "edge from the initialization besides the one through instability.",
    ),
    NoisyMax(
        "dead", ("absent", "later", "init"),
        leak={"later": 0.03, "init": 0.01},
        effects={
            "instability=training": {"later": 0.35},
            "instability=init": {"init": 0.15, "later": 0.25},
            "signal_decay=uniform": {"init": 0.15},
            "data=shifted": {"later": 0.20},
        },
        why="ReLU units never active. Large updates and input scale jumps push units into "
            "the dead region during training.",
    ),
    NoisyMax(
        "data_nan", ("absent", "inside_after", "inside_sudden", "input"),
        leak={"inside_after": 0.003, "inside_sudden": 0.003, "input": 0.001},
        effects={
            "data=corrupted": {"input": 0.62, "inside_sudden": 0.12},
            "instability=training": {"inside_after": 0.30, "inside_sudden": 0.05},
            "instability=init": {"inside_after": 0.15, "inside_sudden": 0.15},
        },
        why="First NaN/Inf: at the model's input boundary (the data carried it in); born "
            "inside after gradients or loss were already growing (overflow); or born inside "
            "out of a healthy run (a malformed sample reaching the net by another path: an "
            "all-masked attention row, a sub-network's own input).",
    ),
    NoisyMax(
        "data_shift", ("absent", "inside", "input"),
        leak={"inside": 0.03, "input": 0.01},
        effects={
            "data=shifted": {"input": 0.85},
            "data=corrupted": {"input": 0.10},
            "instability=training": {"inside": 0.30},
            "instability=init": {"inside": 0.10},
        },
        why="Distribution shift of a layer's input against its own warm-up reference: at the "
            "input boundary (the data changed) or only inside (the weights changed).",
    ),
    NoisyMax(
        "loss_pattern", ("decreasing", "slow", "flat", "spike", "divergence", "nonfinite"),
        leak={"slow": 0.12, "flat": 0.04, "spike": 0.04, "divergence": 0.01, "nonfinite": 0.003},
        effects={
            "learning_rate=too_low": {"slow": 0.40, "flat": 0.45},
            "signal_decay=depth": {"flat": 0.55, "slow": 0.20},
            "signal_decay=uniform": {"flat": 0.65, "slow": 0.15},
            "instability=training": {"nonfinite": 0.35, "divergence": 0.30, "spike": 0.20, "flat": 0.10},
            "instability=init": {"nonfinite": 0.15, "divergence": 0.05, "spike": 0.10,
                                 "flat": 0.10, "slow": 0.10},
            "data=corrupted": {"nonfinite": 0.70, "spike": 0.10, "divergence": 0.05},
            "data=shifted": {"spike": 0.40},
        },
        why="The loss curve, as one variable so spike/divergence/NaN loss are one observation. "
            "States are ordered by precedence: the worst pattern seen is the one observed.",
    ),
    NoisyMax(
        "loss_start", ("normal", "high"),
        leak={"high": 0.04},
        effects={
            "instability=init": {"high": 0.60},
            "data=shifted": {"high": 0.10},
        },
        why="The first loss, before any update, far above the level the run later settles "
            "at: the forward pass is blown up by the weights (or inputs) themselves.",
    ),
    Table(
        "order", ("grad_first", "same_step", "loss_first"), parents=("data", "instability"),
        rows=(
            ({"data": "corrupted"}, (0.15, 0.60, 0.25)),
            ({"data": "shifted"}, (0.20, 0.55, 0.25)),
            ({"instability": "training"}, (0.60, 0.30, 0.10)),
            ({"instability": "init"}, (0.35, 0.55, 0.10)),
            ({}, (1 / 3, 1 / 3, 1 / 3)),
        ),
        why="Which came first when both a gradient event and loss instability occurred "
            "(unobserved otherwise): updates that are too large grow the gradients before the "
            "loss blows up; a bad batch hits loss and gradients at the same step.",
    ),
    # ---- root-cause signatures: each reads one cause's own witness, not a symptom -------
    Table(
        "step_size", ("normal", "tiny", "large", "elevated"), parents=("initialization", "learning_rate"),
        rows=(
            ({"learning_rate": "too_high"}, (0.08, 0.01, 0.75, 0.16)),
            ({"learning_rate": "too_low"}, (0.08, 0.90, 0.01, 0.01)),
            ({"initialization": "too_small"}, (0.35, 0.05, 0.40, 0.20)),
            ({"initialization": "too_large"}, (0.45, 0.45, 0.05, 0.05)),
            ({}, (0.85, 0.015, 0.015, 0.12)),
        ),
        why="The update-to-weight ratio ||w_after - w_before|| / ||w_before|| per layer at its "
            "peak over the run (median over layers): the step size the optimizer actually took. "
            "A healthy run peaks around 1e-4..1e-2 per step. Its only parents are the learning "
            "rate and the weight scale it is relative to: an adaptive optimizer takes steps of "
            "about lr whatever the weights, so tiny weights read as large steps and huge "
            "weights as tiny ones; the initialization signature tells those apart.",
    ),
    Table(
        "init_scale", ("normal", "small", "large"), parents=("initialization",),
        rows=(
            ({"initialization": "too_small"}, (0.08, 0.90, 0.02)),
            ({"initialization": "too_large"}, (0.08, 0.02, 0.90)),
            ({}, (0.99, 0.005, 0.005)),
        ),
        why="The weights' RMS at the first checked step against the nearest reference scale of "
            "their type and fan-in (PyTorch's default kaiming-uniform, Xavier, Kaiming, the std "
            "0.02 of transformer libraries), as the median over weight matrices: a direct "
            "witness of the initialization, whatever normalization or Adam later hide. Weights "
            "that are exactly zero by design (a LoRA B, a zero-init projection) are left out.",
    ),
    Table(
        "target_fault", ("absent", "nonfinite_loss_first", "back_to_chance"), parents=("data", "instability"),
        rows=(
            ({"data": "corrupted"}, (0.60, 0.15, 0.25)),
            ({"instability": "training"}, (0.93, 0.05, 0.02)),
            ({"instability": "init"}, (0.95, 0.03, 0.02)),
            ({"data": "shifted"}, (0.93, 0.02, 0.05)),
            ({}, (0.99, 0.004, 0.006)),
        ),
        why="Faults in the targets, which the input statistics cannot see: the loss turned "
            "non-finite while every monitored input and layer output at that step was finite "
            "(a NaN or Inf target), or the loss, after having learned, went back to its "
            "chance level and stayed there (labels shuffled or misaligned).",
    ),
    Table(
        "retention", ("kept", "partial", "lost"), parents=("data", "learning_rate"),
        rows=(
            ({"learning_rate": "too_high"}, (0.15, 0.25, 0.60)),
            ({"data": "shifted"}, (0.40, 0.25, 0.35)),
            ({"data": "corrupted"}, (0.60, 0.20, 0.20)),
            ({"learning_rate": "too_low"}, (0.97, 0.02, 0.01)),
            ({}, (0.85, 0.12, 0.03)),
        ),
        why="How much of a reference task the run gave up (observed only when the user gives "
            "NeuralDbg a reference loss: a fine-tune's pre-training task on a held-out batch): "
            "the share of its margin to chance lost by the end of the run. A fine-tune at a "
            "step size that rewrites the pre-trained weights forgets it while learning the new "
            "task as well as a healthy one; training on shifted data overwrites it too. A "
            "healthy fine-tune gives some of it up, a too-low learning rate none.",
    ),
    Table(
        "depth_risk", ("low", "deep", "deep_saturating"), parents=("architecture",),
        rows=(
            ({"architecture": "ok"}, (0.88, 0.09, 0.03)),
            ({"architecture": "unstable"}, (0.35, 0.30, 0.35)),
        ),
        why="Structural evidence read from the layer list: a deep plain stack without "
            "normalization, or a stack of saturating activations.",
    ),
)

NODE_BY_NAME: dict[str, Node] = {n.name: n for n in NODES}
LATENT_NAMES: tuple[str, ...] = tuple(n.name for n in NODES if n.latent)
EVIDENCE_NAMES: tuple[str, ...] = tuple(n.name for n in NODES if not n.latent)


def states_of(name: str) -> tuple[str, ...]:
    """States of any variable of the network (root, latent or evidence)."""
    if name in ROOTS:
        return ROOTS[name]
    if name in NODE_BY_NAME:
        return NODE_BY_NAME[name].states
    raise KeyError(f"unknown variable {name!r}; valid: {', '.join(all_variables())}")


def parents_of(name: str) -> tuple[str, ...]:
    """Sorted parents of a variable (roots have none)."""
    if name in ROOTS:
        return ()
    states_of(name)  # raises a KeyError naming the valid variables
    return NODE_BY_NAME[name].parents


def all_variables() -> tuple[str, ...]:
    """Every variable: roots, then latents, then evidence, each in declaration order."""
    return ROOT_NAMES + LATENT_NAMES + EVIDENCE_NAMES


def edges() -> list[tuple[str, str]]:
    """Directed edges ``(parent, child)`` of the network."""
    return [(p, n.name) for n in NODES for p in n.parents]


def _check_structure() -> None:
    """Fail at import if the declaration is inconsistent (cheap; pure Python)."""
    known = set(ROOTS)
    for node in NODES:
        if list(node.parents) != sorted(node.parents):
            raise AssertionError(f"{node.name}: parents must be sorted, got {node.parents}")
        for p in node.parents:
            if p not in known:
                raise AssertionError(f"{node.name}: parent {p!r} is declared after it or unknown")
        if isinstance(node, NoisyMax):
            for key, dist in node.effects.items():
                parent, _, pstate = key.partition("=")
                if pstate not in states_of(parent) or pstate == states_of(parent)[0]:
                    raise AssertionError(f"{node.name}: effect {key!r} names no abnormal state")
                bad = set(dist) - set(node.states[1:])
                if bad or not 0 <= sum(dist.values()) < 1:
                    raise AssertionError(f"{node.name}: effect {key!r} is not a sub-distribution")
            if set(node.leak) - set(node.states[1:]) or not 0 < sum(node.leak.values()) < 1:
                raise AssertionError(f"{node.name}: bad leak {dict(node.leak)}")
        else:
            for pattern, col in node.rows:
                if len(col) != len(node.states) or abs(sum(col) - 1) > 1e-12:
                    raise AssertionError(f"{node.name}: row {pattern} is not a distribution")
                for p, s in pattern.items():
                    if p not in node.parents or s not in states_of(p):
                        raise AssertionError(f"{node.name}: row pattern {pattern} is invalid")
        known.add(node.name)


_check_structure()
