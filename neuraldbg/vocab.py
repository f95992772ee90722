"""The project's vocabulary, defined once: root causes, labels, families and event kinds.

Pure Python (no torch, numpy or pgmpy), so the zoo, the benchmark, the causal network and
the prior files all read the same names from here. ``docs/api.md`` is the contract these
names implement; a developer may add states or variables, never rename these.
"""
from __future__ import annotations

#: Root-cause variables and their states. The first state of each is always ``ok``.
#: ``training_loop`` is the loop's own bugs (each with a direct signature); ``numerics`` is a
#: number that left its dtype: a value out of range inside the network or the optimizer
#: (``overflow``), or updates below the weights' resolution (``updates_lost``); ``unexplained``
#: is a leak: a run that does not learn while no modeled cause explains it.
ROOTS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("ok", "too_high", "too_low"),
    "initialization": ("ok", "too_small", "too_large"),
    "data": ("ok", "corrupted", "shifted"),
    "architecture": ("ok", "unstable"),
    "training_loop": ("ok", "stale_gradients", "params_not_in_optimizer", "graph_detached", "loss_on_probabilities"),
    "numerics": ("ok", "overflow", "updates_lost"),
    "unexplained": ("ok", "not_learning"),
}
#: Roots whose states are kinds of fault rather than degrees of the cause: a sentence reads
#: "training loop: stale gradients", where the others read "learning rate too high".
KIND_ROOTS: frozenset[str] = frozenset({"training_loop", "numerics", "unexplained"})
#: Words a state's name does not spell out.
_STATE_WORDS = {"params_not_in_optimizer": "parameters not in the optimizer"}


def phrase(cause: str, state: str) -> str:
    """How a sentence names ``cause = state``: "learning rate too high", "training loop: stale
    gradients" (the variable names stay those of the API)."""
    words = _STATE_WORDS.get(state, state.replace("_", " "))
    return f"{cause.replace('_', ' ')}{':' if cause in KIND_ROOTS else ''} {words}"


#: The root variables in sorted order (how the network and its tables index them).
ROOT_NAMES: tuple[str, ...] = tuple(sorted(ROOTS))

#: The label of a run with every root cause ``ok``.
HEALTHY = "healthy"
#: One label per abnormal root state, written ``variable/state``, in declaration order.
ABNORMAL_LABELS: tuple[str, ...] = tuple(f"{v}/{s}" for v, ss in ROOTS.items() for s in ss[1:])
#: The benchmark's label space, in tie-breaking order (``healthy`` first).
LABELS: tuple[str, ...] = (HEALTHY,) + ABNORMAL_LABELS

#: Architecture families, each with a prior file shipped in ``neuraldbg/priors/``.
FAMILIES: tuple[str, ...] = ("mlp", "cnn", "transformer", "gan", "lora", "diffusion", "rnn", "gnn", "rl")
#: Family used when neither a family nor a prior path is given.
DEFAULT_FAMILY = "mlp"

#: What the diagnosis must know about how a family trains, one table for every reader:
#: ``non_monotone`` -- the objective is not minimized monotonically (a two-player game, an RL
#: return): a plateau, slow progress or a return to chance level mean nothing there;
#: ``alternating`` -- the first step already holds an optimizer update (a GAN steps its
#: discriminator before the generator's backward), so "at the first step" is not "before any
#: update". Families not listed have no trait.
FAMILY_TRAITS: dict[str, frozenset[str]] = {
    "gan": frozenset({"non_monotone", "alternating"}),
    "rl": frozenset({"non_monotone"}),
}
TRAITS: tuple[str, ...] = ("non_monotone", "alternating")


def has_trait(family: str, trait: str) -> bool:
    """Whether ``family`` has ``trait`` (:data:`FAMILY_TRAITS`); ``ValueError`` for an unknown trait."""
    if trait not in TRAITS:
        raise ValueError(f"unknown family trait {trait!r}; valid: {', '.join(TRAITS)}")
    return trait in FAMILY_TRAITS.get(family, frozenset())


def families_with(trait: str) -> tuple[str, ...]:
    """The families that have ``trait``, in :data:`FAMILIES` order."""
    return tuple(f for f in FAMILIES if has_trait(f, trait))

#: Event types.
GRADIENT = "gradient_health_transition"
ACTIVATION = "activation_regime_shift"
OPTIMIZER = "optimizer_instability"
DATA = "data_anomaly"

#: Event type -> the kinds it may carry.
EVENT_KINDS: dict[str, tuple[str, ...]] = {
    GRADIENT: ("vanishing", "exploding"),
    ACTIVATION: ("dead", "saturated"),
    OPTIMIZER: ("spike", "plateau", "divergence"),
    DATA: ("nan", "inf", "shift"),
}
EVENT_TYPES: tuple[str, ...] = tuple(EVENT_KINDS)
#: Every event kind once, in declaration order (the benchmark's ``events_<kind>`` columns).
ALL_EVENT_KINDS: tuple[str, ...] = tuple(k for kinds in EVENT_KINDS.values() for k in kinds)

#: The failure types users ask about (``explain_failure``), and the (type, kind) pairs that
#: count as evidence of each.
FAILURE_TYPES: dict[str, tuple[tuple[str, str], ...]] = {
    "vanishing_gradients": ((GRADIENT, "vanishing"),),
    "exploding_gradients": ((GRADIENT, "exploding"),),
    "dead_neurons": ((ACTIVATION, "dead"),),
    "saturated_activations": ((ACTIVATION, "saturated"),),
    "optimizer_instability": ((OPTIMIZER, "spike"), (OPTIMIZER, "plateau"), (OPTIMIZER, "divergence")),
    "data_anomaly": ((DATA, "nan"), (DATA, "inf"), (DATA, "shift")),
}


def validate_failure_type(failure_type: str) -> str:
    """Return ``failure_type`` if known, else raise ``ValueError`` naming the valid ones."""
    if failure_type not in FAILURE_TYPES:
        raise ValueError(f"unknown failure_type {failure_type!r}; valid: {', '.join(FAILURE_TYPES)}")
    return failure_type


def validate_family(family: str) -> str:
    """Return ``family`` if known, else raise ``ValueError`` naming the valid ones."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    return family


def validate_truth(truth: tuple[str, str]) -> tuple[str, str]:
    """Return a ``(variable, abnormal state)`` pair if it names a fault, else ``ValueError``."""
    var, state = truth
    if var not in ROOTS or state not in ROOTS[var][1:]:
        valid = ", ".join(f"{v}={s}" for v, ss in ROOTS.items() for s in ss[1:])
        raise ValueError(f"{var}={state} is not a root-cause fault; valid: {valid}")
    return truth
