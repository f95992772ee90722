"""From a posterior to ranked, explained hypotheses and causal chains.

Which events a hypothesis "rests on" is not a hand-written rule: an observed evidence
variable supports a hypothesis ``cause = state`` when its likelihood ratio
``P(obs | cause = state, other roots ok) / P(obs | all ok)`` is at least
:data:`SUPPORT_LR`; the hypothesis' evidence is the events behind those observations, its
failure type the one whose evidence favours it most, its origin layer and onset step the
first of those events (earliest step, then nearest the input).
"""
from __future__ import annotations

from typing import Mapping

from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.evidence import Evidence
from neuraldbg.causal.fixes import describe, headline, suggested_fix, unobserved_note
from neuraldbg.causal.nodes.loop import DETACHED_LAYER, ORPHAN_LAYER
from neuraldbg.causal.types import CausalChain, Hypothesis, Posterior
from neuraldbg.events.base import FAILURE_TYPES, Event
from neuraldbg.trace import Trace
from neuraldbg.vocab import ROOTS

#: Reporting floor: an abnormal root state is reported as a hypothesis only when its
#: posterior is at least this. Family priors put every abnormal state at 0.15 or less, so a
#: run without evidence reports nothing; one clear symptom lifts its cause far above it.
REPORT_FLOOR = 0.2
#: Likelihood ratio from which an observation counts as support for a hypothesis.
SUPPORT_LR = 1.5

#: Evidence variables that stand for each failure type (what ``explain_failure`` reads).
FAILURE_VARIABLES: dict[str, tuple[str, ...]] = {
    "vanishing_gradients": ("vanishing",),
    "exploding_gradients": ("exploding",),
    "dead_neurons": ("dead",),
    "saturated_activations": ("saturation",),
    "optimizer_instability": ("loss_pattern", "loss_start", "progress", "output_collapse"),
    "data_anomaly": ("data_nan", "data_shift", "target_fault", "input_scale"),
}
#: Normal state of each failure variable (the failure "did not occur").
_NORMAL = {"vanishing": "absent", "exploding": "absent", "dead": "absent", "saturation": "absent",
           "loss_pattern": "decreasing", "loss_start": "normal", "data_nan": "absent", "data_shift": "absent",
           "target_fault": "absent", "progress": "learning", "input_scale": "normal", "output_collapse": "absent",
           "weights_precision": "full", "update_lost": "moved"}
_VAR_FAILURE = {v: ft for ft, vs in FAILURE_VARIABLES.items() for v in vs}

#: Failure type of a hypothesis with no event-backed evidence (e.g. a flat loss only).
DEFAULT_FAILURE: dict[tuple[str, str], str] = {
    ("learning_rate", "too_high"): "optimizer_instability",
    ("learning_rate", "too_low"): "optimizer_instability",
    ("initialization", "too_small"): "vanishing_gradients",
    ("initialization", "too_large"): "exploding_gradients",
    ("data", "corrupted"): "data_anomaly",
    ("data", "shifted"): "data_anomaly",
    ("architecture", "unstable"): "vanishing_gradients",
    **{("training_loop", s): "optimizer_instability" for s in ROOTS["training_loop"][1:]},
    ("numerics", "overflow"): "data_anomaly",
    ("numerics", "updates_lost"): "optimizer_instability",
    ("unexplained", "not_learning"): "optimizer_instability",
}
#: Variables whose reading is itself the finding when no event backs a hypothesis (its note is
#: the sentence), most telling first: the loop's and the input's own signatures, a forgotten
#: reference; then the root causes' signatures (a 100x rate that still learns shows only
#: there), the one that favours the hypothesis most; then the stall
_NOTE_VARS = ("stale_grads", "orphan_params", "detached", "loss_input", "input_scale", "retention")
_SIGNATURE_NOTE_VARS = ("update_lost", "step_size", "init_scale", "warmup", "target_fault")
#: The layer a loop bug names, read from its signature
_LAYER_SIGNATURE = {("training_loop", "params_not_in_optimizer"): ORPHAN_LAYER,
                    ("training_loop", "graph_detached"): DETACHED_LAYER}


def _event_key(trace: Trace):
    def key(e: Event) -> tuple:
        idx = trace.layer_index(e.layer)
        return (e.step, 10**9 if idx is None else idx, e.type, e.kind)
    return key


def _failure_events(trace: Trace, failure_type: str) -> list[Event]:
    pairs = set(FAILURE_TYPES[failure_type])
    return sorted((e for e in trace.events if (e.type, e.kind) in pairs), key=_event_key(trace))


def _state_text(value: str | tuple[str, ...] | None) -> str:
    """An observed state for a sentence: ``'flat'``, or ``one of 'slow', 'flat'`` for a partial one."""
    if isinstance(value, tuple):
        return "one of " + ", ".join(repr(v) for v in value)
    return repr(value)


def _abnormal(value: str | tuple[str, ...], var: str) -> bool:
    normal = _NORMAL.get(var)
    return normal is None or (value != normal if isinstance(value, str) else normal not in value)


def support(net: CompiledNetwork, ev: Evidence, cause: str, state: str) -> dict[str, float]:
    """Observed variables whose likelihood ratio favours ``cause = state``: var -> LR."""
    out = {}
    for var, value in ev.observed.items():
        lr = net.likelihood_ratio(var, value, cause, state)
        if lr >= SUPPORT_LR:
            out[var] = lr
    return out


def build(trace: Trace, post: Posterior, net: CompiledNetwork, ev: Evidence, cause: str, state: str,
          failure_type: str | None = None) -> Hypothesis:
    """The :class:`Hypothesis` for ``cause = state`` (optionally for one failure type).

    Without ``failure_type`` the origin is the first supporting event (earliest step; a
    layer event before a loss event; nearest the input; the most telling variable on ties)
    and the failure type is that event's.
    """
    p = post[cause][state]
    sup = support(net, ev, cause, state)
    weight: dict[Event, float] = {}
    for var, lr in sup.items():
        for e in ev.support.get(var, ()):
            weight[e] = max(weight.get(e, 0.0), lr)
    key = _event_key(trace)
    entry = _data_entry(ev) if cause == "data" else None
    if entry is not None:  # a data fault enters at a step: nothing before it is its consequence
        weight = {e: w for e, w in weight.items() if e.step >= entry}
    events = sorted(weight, key=key)
    if failure_type is None:
        first = _origin(events, trace, weight)
        if first is not None:
            failure_type = _PAIR_FAILURE[(first.type, first.kind)]
        else:
            ranked = sorted(((lr, var) for var, lr in sup.items() if var in _VAR_FAILURE
                             and _abnormal(ev.observed[var], var)), reverse=True)
            failure_type = _VAR_FAILURE[ranked[0][1]] if ranked else DEFAULT_FAILURE[(cause, state)]
    else:
        pairs = set(FAILURE_TYPES[failure_type])
        primary = [e for e in events if (e.type, e.kind) in pairs] or _failure_events(trace, failure_type)
        first = _origin(primary, trace, weight)
    origin = first.layer if first is not None else None
    layer_sig = _LAYER_SIGNATURE.get((cause, state))
    if origin is None and layer_sig is not None:
        origin = trace.signatures.value(layer_sig)
    onset = first.step if first is not None else _loss_onset(trace)
    rank = first.rank if first is not None else None
    fix = suggested_fix(trace, ev, cause, state, origin, onset)
    # the sentence cites what carried the hypothesis, not what came first: the observation with
    # the largest likelihood ratio (a zero-grad check at step 16 before the blow-up it caused)
    cited, noted = _cited(trace, ev, sup, events, weight)
    if noted is None and cited is None and first is None:
        noted = _noted(sup, ev)
    head = headline(cause, state, p)
    if cited is not None:
        text = describe(cause, state, p, _PAIR_FAILURE[(cited.type, cited.kind)], cited.layer, cited.step,
                        cited.rank)
    elif noted is None:
        text = describe(cause, state, p, failure_type, origin, onset, rank)
    elif noted == "retention":  # nothing in the loop shows it: the reference does
        text = f"{head}: the run forgot its reference task ({ev.notes['retention']})."
    elif (cause, state) == ("unexplained", "not_learning"):
        text = f"{head}: {ev.notes[noted]}, and no modeled cause explains it."
    else:
        text = f"{head}: {ev.notes[noted]}."
    if cited is not None and "input_scale" in sup and ev.observed.get("input_scale") == "large":
        text += f" {ev.notes['input_scale'][0].upper()}{ev.notes['input_scale'][1:]}."  # names the features
    text += unobserved_note(net, ev, cause, state)
    return Hypothesis(cause=cause, state=state, probability=p, failure_type=failure_type,
                      origin_layer=origin, onset_step=onset, evidence=tuple(events),
                      suggested_fix=fix, description=text, origin_rank=rank)


def decisive(sup: Mapping[str, float]) -> str | None:
    """The observed variable that carried a hypothesis: the largest likelihood ratio among its
    supporting observations (ties: the name, so the choice is stable)."""
    return max(sup, key=lambda v: (sup[v], v)) if sup else None


def _cited(trace: Trace, ev: Evidence, sup: Mapping[str, float], events: list[Event],
           weight: Mapping[Event, float]) -> tuple[Event | None, str | None]:
    """What the sentence cites: the first event of the decisive observation, or its note when
    no event stands behind it (a signature: a check, a schedule, a scale); ``(None, None)``
    when it has neither."""
    var = decisive(sup)
    if var is None:
        return None, None
    behind = set(ev.support.get(var, ()))
    first = _origin([e for e in events if e in behind], trace, weight)
    if first is not None:
        return first, None
    return None, (var if var in ev.notes else None)


def _noted(sup: Mapping[str, float], ev: Evidence) -> str | None:
    """The variable whose note is the sentence of a hypothesis no event backs (see _NOTE_VARS)."""
    noted = next((v for v in _NOTE_VARS if v in sup and v in ev.notes), None)
    if noted is None:
        sigs = [(sup[v], v) for v in _SIGNATURE_NOTE_VARS if v in sup and v in ev.notes]
        # then the stall: where the loss ends, or an output that stopped depending on the input
        noted = max(sigs)[1] if sigs else next((v for v in ("progress", "output_collapse")
                                                if v in sup and v in ev.notes), None)
    return noted


def _data_entry(ev: Evidence) -> int | None:
    """First step of a data-anomaly event (where a data fault enters the run)."""
    steps = [e.step for var in ("data_nan", "data_shift") for e in ev.support.get(var, ())]
    return min(steps) if steps else None


_PAIR_FAILURE = {pair: ft for ft, pairs in FAILURE_TYPES.items() for pair in pairs}


def _origin(events: list[Event], trace: Trace, weight: Mapping[Event, float] | None = None) -> Event | None:
    """First event: earliest step; at the same step a layer event beats a loss event (it is
    upstream), then the layer nearest the input, then the most telling evidence."""
    if not events:
        return None
    w = weight or {}

    def key(e: Event) -> tuple:
        idx = trace.layer_index(e.layer)
        return (e.step, e.layer is None, 10**9 if idx is None else idx, -w.get(e, 0.0), e.type, e.kind)
    return min(events, key=key)


def _loss_onset(trace: Trace) -> int | None:
    return trace.loss.first_nonfinite_step


def hypotheses(trace: Trace, post: Posterior, net: CompiledNetwork, ev: Evidence,
               floor: float = REPORT_FLOOR) -> list[Hypothesis]:
    """Every abnormal root state with posterior >= ``floor``, most probable first."""
    out = [build(trace, post, net, ev, v, s) for v, s, p in post.abnormal() if p >= floor]
    return sorted(out, key=lambda h: -h.probability)


def failure_observed(trace: Trace, ev: Evidence, failure_type: str) -> bool:
    """Whether ``failure_type`` occurred: an event of its kinds, or its variable abnormal."""
    if _failure_events(trace, failure_type):
        return True
    return any(var in ev.observed and _abnormal(ev.observed[var], var) for var in FAILURE_VARIABLES[failure_type])


def explaining(trace: Trace, post: Posterior, net: CompiledNetwork, ev: Evidence,
               failure_type: str) -> list[tuple[str, str, float]]:
    """Abnormal root states whose likelihood is raised by the observed ``failure_type``
    evidence, as ``(cause, state, posterior)``, most probable first."""
    if not failure_observed(trace, ev, failure_type):
        return []
    out = []
    for var, state, p in post.abnormal():
        for fv in FAILURE_VARIABLES[failure_type]:
            if fv in ev.observed and _abnormal(ev.observed[fv], fv) \
                    and net.likelihood_ratio(fv, ev.observed[fv], var, state) >= SUPPORT_LR:
                out.append((var, state, p))
                break
    return out


def explain(trace: Trace, post: Posterior, net: CompiledNetwork, ev: Evidence, failure_type: str | None,
            floor: float = REPORT_FLOOR) -> list[Hypothesis]:
    """Hypotheses above ``floor`` that explain ``failure_type`` (all when ``None``)."""
    if failure_type is None:
        return hypotheses(trace, post, net, ev, floor)
    return [build(trace, post, net, ev, v, s, failure_type)
            for v, s, p in explaining(trace, post, net, ev, failure_type) if p >= floor]


def chain(trace: Trace, post: Posterior, net: CompiledNetwork, ev: Evidence, failure_type: str,
          floor: float = REPORT_FLOOR) -> CausalChain:
    """Most probable explaining root cause -> first event -> propagation, in order.

    The chain's events are the failure type's own (an exploding-gradients chain holds exploding
    events, however the cause's other evidence reads), ordered by step, then forward position.
    """
    events = _failure_events(trace, failure_type)
    if not events:
        why = f"no {failure_type} event in this trace"
        if failure_observed(trace, ev, failure_type):
            why += (f" (the loss curve reads {_state_text(ev.observed.get('loss_pattern'))}, but no event marks "
                    "where it started)")
        return CausalChain(failure_type, None, None, 0.0, None, (), reason=why)
    cands = explaining(trace, post, net, ev, failure_type)
    if not cands:
        return CausalChain(failure_type, None, None, 0.0, events[0], tuple(events[1:]),
                           reason="no root cause in the model raises the probability of this evidence")
    cause, state, p = cands[0]
    reason = "" if p >= floor else f"the most probable cause is below the reporting floor ({floor})"
    return CausalChain(failure_type, cause, state, p, events[0], tuple(events[1:]), reason=reason)
