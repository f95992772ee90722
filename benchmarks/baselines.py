"""Rule-based baselines scored on the very same traces as the Bayesian network.

Both baselines read what the monitor exported (events plus the loss summary), so the
comparison isolates the *inference* step: the same detections, turned into a diagnosis by
rules instead of by posterior inference. Each returns a distribution over the benchmark's
labels (:data:`neuraldbg.vocab.LABELS`), so Brier score and log loss compare directly.

(a) :func:`first_event` - the style of earlier NeuralDBG releases: the first event's kind
    names a cause with a fixed confidence; the rest of the mass is spread evenly.
(b) :func:`threshold_rules` - the style of AutoTrainer (Zhang et al., ICSE 2021) and Amazon
    SageMaker Debugger built-in rules: independent yes/no rules (VanishingGradient,
    ExplodingTensor, LossNotDecreasing, DeadRelu, SaturatedActivation, ...) each mapped to
    the causes its documentation suggests; fired rules vote, nothing fired means healthy.

The confidences are fixed by hand, as those tools do; they are *not* fitted to the benchmark.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from neuraldbg.vocab import HEALTHY, LABELS, validate_truth


def _label(variable: str, state: str) -> str:
    """The label of a root-cause fault, checked against the vocabulary at import."""
    return "/".join(validate_truth((variable, state)))


LR_HIGH = _label("learning_rate", "too_high")
LR_LOW = _label("learning_rate", "too_low")
INIT_SMALL = _label("initialization", "too_small")
INIT_LARGE = _label("initialization", "too_large")
DATA_BAD = _label("data", "corrupted")
DATA_SHIFT = _label("data", "shifted")
ARCH = _label("architecture", "unstable")

#: (a) first event kind -> (label, fixed confidence), as earlier releases printed them.
FIRST_EVENT_RULES: dict[str, tuple[str, float]] = {
    "nan": (DATA_BAD, 0.9),
    "inf": (DATA_BAD, 0.9),
    "shift": (DATA_SHIFT, 0.8),
    "exploding": (LR_HIGH, 0.7),
    "divergence": (LR_HIGH, 0.7),
    "spike": (LR_HIGH, 0.6),
    "vanishing": (INIT_SMALL, 0.6),
    "saturated": (ARCH, 0.6),
    "dead": (LR_HIGH, 0.5),
    "plateau": (LR_LOW, 0.6),
}
#: (a) confidence of "healthy" when the trace has no event at all.
NO_EVENT_CONFIDENCE = 0.9

#: (b) probability left on every label whatever the rules say, so no label is ever impossible.
RULE_LEAK = 0.05
#: (b) LossNotDecreasing: fires when the last loss is above this fraction of the first.
LOSS_NOT_DECREASING_RATIO = 0.9


@dataclass(frozen=True)
class Rule:
    """One threshold rule: a yes/no test on the trace and the causes it points to (weights sum to 1)."""

    name: str
    origin: str
    fires: Callable[["TraceView"], bool]
    causes: Mapping[str, float]


@dataclass(frozen=True)
class TraceView:
    """The parts of an exported session the baselines read: events (dicts) and the loss summary."""

    events: tuple[Mapping[str, Any], ...]
    loss_first: float | None = None
    loss_last: float | None = None
    loss_nonfinite: int = 0

    def kinds(self) -> set[str]:
        """Event kinds present anywhere in the trace."""
        return {str(e.get("kind")) for e in self.events}


def _has(*kinds: str) -> Callable[[TraceView], bool]:
    return lambda t: bool(t.kinds() & set(kinds))


def _loss_not_decreasing(t: TraceView) -> bool:
    if "plateau" in t.kinds():
        return True
    a, b = t.loss_first, t.loss_last
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or a <= 0:
        return False
    return b > LOSS_NOT_DECREASING_RATIO * a


def _exploding_tensor(t: TraceView) -> bool:
    return t.loss_nonfinite > 0 or bool(t.kinds() & {"nan", "inf"})


#: (b) the rules, in the order reports list them.
THRESHOLD_RULES: tuple[Rule, ...] = (
    Rule("ExplodingTensor", "SageMaker Debugger", _exploding_tensor,
         {LR_HIGH: 0.4, DATA_BAD: 0.4, INIT_LARGE: 0.2}),
    Rule("VanishingGradient", "SageMaker Debugger / AutoTrainer", _has("vanishing"),
         {INIT_SMALL: 0.5, ARCH: 0.5}),
    Rule("ExplodingGradient", "AutoTrainer", _has("exploding"),
         {LR_HIGH: 0.6, INIT_LARGE: 0.4}),
    Rule("DeadRelu", "SageMaker Debugger / AutoTrainer (dying ReLU)", _has("dead"),
         {LR_HIGH: 0.4, INIT_SMALL: 0.3, ARCH: 0.3}),
    Rule("SaturatedActivation", "SageMaker Debugger", _has("saturated"),
         {ARCH: 0.6, INIT_LARGE: 0.4}),
    Rule("LossNotDecreasing", "SageMaker Debugger / AutoTrainer (slow convergence)", _loss_not_decreasing,
         {LR_LOW: 0.6, INIT_SMALL: 0.2, DATA_SHIFT: 0.2}),
    Rule("OscillatingLoss", "AutoTrainer", _has("spike"),
         {LR_HIGH: 0.8, DATA_SHIFT: 0.2}),
    Rule("Divergence", "SageMaker Debugger (loss trend)", _has("divergence"),
         {LR_HIGH: 0.7, INIT_LARGE: 0.3}),
    Rule("InputDistributionShift", "SageMaker Model Monitor (data drift)", _has("shift"),
         {DATA_SHIFT: 0.9, LR_HIGH: 0.1}),
)


# --------------------------------------------------------------------------- reading traces

def view(session: Any) -> TraceView:
    """Normalize what a baseline may be given into a :class:`TraceView`.

    Accepts an exported session as a dict (``{"events": [...], "loss": {...}}``), a loaded
    session or live monitor (anything with ``.events`` and optionally ``.trace()``), or a
    plain list of events (dicts or :class:`neuraldbg.events.base.Event`).
    """
    if isinstance(session, TraceView):
        return session
    loss: Any = None
    if isinstance(session, Mapping):
        events = session.get("events", [])
        loss = session.get("loss") or session.get("loss_summary")
        if loss is None and isinstance(session.get("trace"), Mapping):
            loss = session["trace"].get("loss")
    elif hasattr(session, "events"):
        events = session.events
        try:
            loss = session.trace().loss if hasattr(session, "trace") else None
        except Exception:  # a degraded monitor: rules still see the events
            loss = None
    else:
        events = session
    evs = tuple(sorted((_event_dict(e) for e in events), key=lambda e: int(e.get("step") or 0)))
    return TraceView(events=evs, loss_first=_num(_get(loss, "first")), loss_last=_num(_get(loss, "last")),
                     loss_nonfinite=int(_num(_get(loss, "n_nonfinite")) or 0))


def _event_dict(e: Any) -> Mapping[str, Any]:
    if isinstance(e, Mapping):
        return e
    if hasattr(e, "to_dict"):
        return e.to_dict()
    return {k: getattr(e, k, None) for k in ("type", "kind", "layer", "step")}


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- the baselines

def _spread(mass: Mapping[str, float], labels: Sequence[str]) -> dict[str, float]:
    """Mass on named labels, the remainder spread evenly over all labels; sums to 1."""
    named = sum(mass.values())
    rest = max(0.0, 1.0 - named) / len(labels)
    return {lab: mass.get(lab, 0.0) + rest for lab in labels}


def first_event(session: Any, labels: Sequence[str] = LABELS) -> dict[str, float]:
    """(a) First-event rule: the earliest event's kind -> one cause with a fixed confidence."""
    t = view(session)
    if not t.events:
        return _spread({HEALTHY: NO_EVENT_CONFIDENCE}, labels)
    kind = str(t.events[0].get("kind"))
    if kind not in FIRST_EVENT_RULES:  # a kind newer than the rule table: no opinion
        return _spread({}, labels)
    label, conf = FIRST_EVENT_RULES[kind]
    return _spread({label: conf}, labels)


def fired_rules(session: Any) -> list[str]:
    """Names of the threshold rules that fire on a trace."""
    t = view(session)
    return [r.name for r in THRESHOLD_RULES if r.fires(t)]


def threshold_rules(session: Any, labels: Sequence[str] = LABELS) -> dict[str, float]:
    """(b) Threshold rules: every fired rule votes for its causes equally; none fired -> healthy."""
    t = view(session)
    votes: dict[str, float] = {}
    fired = [r for r in THRESHOLD_RULES if r.fires(t)]
    for r in fired:
        for lab, w in r.causes.items():
            votes[lab] = votes.get(lab, 0.0) + w / len(fired)
    if not fired:
        votes = {HEALTHY: 1.0}
    return _spread({lab: (1 - RULE_LEAK) * w for lab, w in votes.items()}, labels)


#: Baselines by the name reports use.
BASELINES: dict[str, Callable[..., dict[str, float]]] = {
    "first_event": first_event,
    "threshold_rules": threshold_rules,
}


def run_all(session: Any, labels: Sequence[str] = LABELS) -> dict[str, dict[str, float]]:
    """Every baseline's distribution for one trace."""
    return {name: fn(session, labels) for name, fn in BASELINES.items()}


def events_of(session: Any) -> Iterable[Mapping[str, Any]]:
    """The events of a session as dicts in step order (what the baselines saw)."""
    return view(session).events
