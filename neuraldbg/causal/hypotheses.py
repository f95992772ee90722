"""From a posterior to ranked, explained hypotheses and causal chains.

Which events a hypothesis "rests on" is not a hand-written rule: an observed evidence
variable supports a hypothesis ``cause = state`` when its likelihood ratio
``P(obs | cause = state, other roots ok) / P(obs | all ok)`` is at least
:data:`SUPPORT_LR`; the hypothesis' evidence is the events behind those observations, its
failure type the one whose evidence favours it most, its origin layer and onset step the
first of those events (earliest step, then nearest the input).
"""
from __future__ import annotations

import math
from typing import Mapping

from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.evidence import Evidence
from neuraldbg.causal.nodes.causes import retention_not_kept
from neuraldbg.causal.nodes.run import LR, LR_PEAK
from neuraldbg.causal.types import CausalChain, Hypothesis, Posterior
from neuraldbg.events.base import FAILURE_TYPES, Event
from neuraldbg.trace import Trace

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
    "optimizer_instability": ("loss_pattern", "loss_start"),
    "data_anomaly": ("data_nan", "data_shift", "target_fault"),
}
#: Normal state of each failure variable (the failure "did not occur").
_NORMAL = {"vanishing": "absent", "exploding": "absent", "dead": "absent", "saturation": "absent",
           "loss_pattern": "decreasing", "loss_start": "normal", "data_nan": "absent", "data_shift": "absent",
           "target_fault": "absent"}
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
}


def _event_key(trace: Trace):
    def key(e: Event) -> tuple:
        idx = trace.layer_index(e.layer)
        return (e.step, 10**9 if idx is None else idx, e.type, e.kind)
    return key


def _failure_events(trace: Trace, failure_type: str) -> list[Event]:
    pairs = set(FAILURE_TYPES[failure_type])
    return sorted((e for e in trace.events if (e.type, e.kind) in pairs), key=_event_key(trace))


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
    onset = first.step if first is not None else _loss_onset(trace)
    rank = first.rank if first is not None else None
    fix = suggested_fix(trace, ev, cause, state, origin, onset)
    text = describe(cause, state, p, failure_type, origin, onset, rank)
    if first is None and "retention" in sup:  # nothing in the loop shows it: the reference does
        text = (f"{cause} is {state.replace('_', ' ')} (p={p:.2f}): the run forgot its reference task "
                f"({ev.notes['retention']}).")
    return Hypothesis(cause=cause, state=state, probability=p, failure_type=failure_type,
                      origin_layer=origin, onset_step=onset, evidence=tuple(events),
                      suggested_fix=fix, description=text, origin_rank=rank)


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


def describe(cause: str, state: str, p: float, failure_type: str, layer: str | None, step: int | None,
             rank: int | None = None) -> str:
    """One sentence naming cause, state, probability, failure type, layer, step (and rank)."""
    what = failure_type.replace("_", " ")
    where = f"layer `{layer}`" if layer is not None else "the loss (no layer event)"
    when = f"step {step}" if step is not None else "an unknown step"
    on = f" on rank {rank}" if rank is not None else ""
    return f"{cause} is {state.replace('_', ' ')} (p={p:.2f}): {what} first seen in {where} at {when}{on}."


def _lr_text(trace: Trace) -> str:
    """The rate a fix should start from: the peak of the schedule (``lr_peak``), since a decayed
    schedule ends near 0 and "10x lower than the end" would mean nothing; the current rates
    when the schedule never went above them (a constant rate)."""
    lrs = trace.signatures.value(LR)
    now: list[float] = []
    if isinstance(lrs, (list, tuple)):
        try:
            now = sorted({float(x) for x in lrs if math.isfinite(float(x))})
        except (TypeError, ValueError):
            now = []
    peak = trace.signatures.number(LR_PEAK)
    if peak is not None and math.isfinite(peak) and peak > 0 and (not now or max(now) < peak):
        return f" (peak {peak:g})"
    if now:
        return f" (currently {', '.join(f'{v:g}' for v in now)})"
    return ""


def suggested_fix(trace: Trace, ev: Evidence, cause: str, state: str, layer: str | None, step: int | None) -> str:
    """One specific sentence: what to change, where and when."""
    at = f"`{layer}`" if layer else "the first layer"
    when = f" at step {step}" if step is not None else ""
    if (cause, state) == ("learning_rate", "too_high"):
        if layer is None and step is None and retention_not_kept(ev.observed.get("retention")):
            return (f"Lower the learning rate about 10x{_lr_text(trace)} (or train fewer steps): the updates "
                    "overwrite what the model knew while the training loss still falls.")
        return (f"Lower the learning rate about 10x{_lr_text(trace)} or add warm-up and gradient "
                f"clipping; the blow-up starts{when} in {at}.")
    if (cause, state) == ("learning_rate", "too_low"):
        return (f"Raise the learning rate about 10x{_lr_text(trace)} (or run a learning-rate range "
                "test); the loss barely moves.")
    if (cause, state) == ("initialization", "too_small"):
        return (f"Re-initialize {at} and the layers after it with Kaiming (ReLU) or Xavier "
                "(tanh/sigmoid) initialization at the default scale.")
    if (cause, state) == ("initialization", "too_large"):
        return (f"Re-initialize {at} with Kaiming/Xavier at the default scale; the oversized "
                "weights blow up the forward pass from the first step.")
    if (cause, state) == ("data", "corrupted"):
        return (f"Drop or repair the NaN/Inf batch{when} (filter non-finite samples in the data "
                f"pipeline or apply torch.nan_to_num) before it reaches {at}.")
    if (cause, state) == ("data", "shifted"):
        return (f"Normalize inputs with fixed training-set statistics before {at}; their scale "
                f"or distribution changed{when}.")
    # architecture / unstable: tailor the remedy to what the structure shows
    types = {li.type for li in trace.layers}
    risk = ev.observed.get("depth_risk")
    if types & {"RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"} or trace.family == "rnn":
        return (f"Clip gradients and prefer gated cells (LSTM/GRU) or shorter unrolls for {at}; "
                "the recurrence is the unstable part.")
    if trace.family == "gnn":
        return f"Use fewer message-passing layers or add residual/normalization around {at} to stop oversmoothing."
    if risk == "deep_saturating" or ev.observed.get("saturation") not in (None, "absent"):
        return (f"Add normalization/residual connections or swap sigmoid/tanh for ReLU/GELU in the "
                f"stack starting at {at}.")
    return f"Add normalization/residual connections (or reduce depth) around {at}."


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

    The chain's events are the root cause's supporting events up to the failure's first
    event (how the cause reached it), then every event of the failure type (how it spread);
    ordered by step, then forward position.
    """
    events = _failure_events(trace, failure_type)
    if not events:
        why = f"no {failure_type} event in this trace"
        if failure_observed(trace, ev, failure_type):
            why += f" (the loss curve reads {ev.observed.get('loss_pattern')!r}, but no event marks where it started)"
        return CausalChain(failure_type, None, None, 0.0, None, (), reason=why)
    key = _event_key(trace)
    cands = explaining(trace, post, net, ev, failure_type)
    if not cands:
        return CausalChain(failure_type, None, None, 0.0, events[0], tuple(events[1:]),
                           reason="no root cause in the model raises the probability of this evidence")
    cause, state, p = cands[0]
    onset = key(_origin(events, trace))
    sup = support(net, ev, cause, state)
    upstream = {e for var in sup for e in ev.support.get(var, ()) if key(e) <= onset}
    ordered = sorted(upstream | set(events), key=key)
    reason = "" if p >= floor else f"the most probable cause is below the reporting floor ({floor})"
    return CausalChain(failure_type, cause, state, p, ordered[0], tuple(ordered[1:]), reason=reason)
