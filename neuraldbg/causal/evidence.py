"""From a :class:`~neuraldbg.trace.Trace` to discretized evidence, with documented cut points.

Each evidence variable of :mod:`.structure` is computed here. A variable is **observed** when
the trace could have shown it (gradient evidence needs layers with parameters, saturation a
bounded activation module, dead units a ReLU module, loss evidence recorded losses) and **unobserved** otherwise, in which case the engine marginalizes it;
absence of an event is evidence only when the detector that would emit it was running.
Some observations are *partial*: a set of states (e.g. for a GAN's loss, "none of spike,
divergence, non-finite" without telling decreasing from flat), which the engine handles
exactly as the disjunction of those states.

Cut points (module constants, also listed in ``docs/causal_model.md``):

* ``INIT_STEPS`` -- an event is "at init" when it starts within the first ``INIT_STEPS``
  checked steps of the trace. The first step's gradients are computed before any update, so
  only weights, inputs and structure can be at fault there; by the time an update of a
  too-large step size shows, at least one update has happened.
* ``MIN_LOSS_POINTS`` -- fewer recorded losses than this: slow vs decreasing is unknowable.
* ``FLAT_REL``/``SLOW_REL`` -- relative improvement of the loss (median of the first vs the
  last ``LOSS_EDGE`` fraction of the history) under which the curve is "flat" or "slow".
* ``SMALL_SIGNAL`` -- at a vanishing onset at init, the median output RMS (``out_rms``) of
  the vanishing layers under which the forward signal is "small too" (``init_uniform``:
  every weight is small) rather than normal (``init_depth``: only the backward signal
  decays through depth). Default-initialized layers on normalized inputs output RMS
  0.1..1; weights scaled down 100x or more land below 1e-2.
* ``START_FACTOR``/``MIN_START_POINTS`` -- ``loss_start`` is "high" when the first loss is
  more than ``START_FACTOR`` times the median of the second half of the run (at least
  ``MIN_START_POINTS`` finite losses recorded). Healthy curves drop 3-50x over a short run;
  a forward pass blown up by the weights starts orders of magnitude above where it settles.
* ``COUPLING_LAYERS``/``COUPLING_STEPS`` -- saturation at init is "with vanishing" when a
  vanishing event starts at most ``COUPLING_STEPS`` steps from it, at most
  ``COUPLING_LAYERS`` layers away in forward order.
* ``TOKEN_INPUT_TYPES`` -- when the first monitored layer is one of these (token ids in),
  the input distribution is that of the ids: ``data_shift`` is observed only once the token
  watch (``neuraldbg/events/tokens.py``) has built its warm-up reference.
* ``SUDDEN_WINDOW`` -- a NaN/Inf born inside the network is "after" instability when an
  exploding-gradient, spike or divergence event was active within this many steps before
  it, "sudden" otherwise (overflow builds up; a malformed sample does not).
* ``DEEP_LAYERS``/``SATURATING_DEPTH`` -- depth_risk: "deep" with at least ``DEEP_LAYERS``
  parameter layers and no normalization layer; "deep_saturating" with at least
  ``SATURATING_DEPTH`` saturating activation modules (sigmoid, tanh...) and no normalization.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

# the loss-curve constants both readings share are defined once, with the signatures
from neuraldbg.causal.signatures import (GAME_BAND, MIN_LOSS_POINTS, NON_MONOTONE_FAMILIES, START_CHANCE_FACTOR,
                                         chance_loss, loss_rise, meta_float, signature_evidence)
from neuraldbg.events.base import ACTIVATION, DATA, GRADIENT, OPTIMIZER, Event
from neuraldbg.trace import Trace

INIT_STEPS = 1
LOSS_EDGE = 0.1
FLAT_REL = 0.02
SLOW_REL = 0.10
SMALL_SIGNAL = 1e-2
SUDDEN_WINDOW = 5
START_FACTOR = 100.0
MIN_START_POINTS = 10
COUPLING_LAYERS = 2
COUPLING_STEPS = 5
DEEP_LAYERS = 12
SATURATING_DEPTH = 6

#: families whose first step already contains an optimizer update (alternating G/D steps):
#: a symptom at the first step may be caused by the step size, so "at init" is partial there
ALTERNATING_FAMILIES = ("gan",)

SATURATING_TYPES = frozenset({"Sigmoid", "Tanh", "Hardtanh", "Hardsigmoid", "Softsign", "LogSigmoid",
                              "Tanhshrink"})
NORM_TYPES = frozenset({"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LayerNorm",
                        "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "RMSNorm",
                        "LocalResponseNorm", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d"})

#: activation modules on which the monitor measures saturation / dead units: absence of those
#: events is evidence only when the model has such modules
BOUNDED_TYPES = frozenset({"Sigmoid", "Tanh", "Hardtanh", "Hardsigmoid", "Softsign", "Softmax"})
RELU_TYPES = frozenset({"ReLU", "ReLU6"})

#: first-layer types that take integer token ids (no float input to watch for shifts)
TOKEN_INPUT_TYPES = frozenset({"Embedding", "EmbeddingBag"})

#: loss-pattern states that say "no instability" (a partial observation when progress is unknowable)
CALM_LOSS = ("decreasing", "slow", "flat")


@dataclass(frozen=True)
class Evidence:
    """Discretized evidence of one trace.

    ``observed`` maps an evidence variable to a state, or to a tuple of states for a partial
    observation; unobserved variables are absent. ``support`` gives the events behind each
    observation and ``notes`` a short human-readable reason.
    """

    observed: Mapping[str, str | tuple[str, ...]]
    support: Mapping[str, tuple[Event, ...]] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)


def _kind(events: Iterable[Event], type_: str, *kinds: str) -> list[Event]:
    return [e for e in events if e.type == type_ and e.kind in kinds]


def _first(events: list[Event], trace: Trace) -> Event:
    """Earliest event; ties go to the input side (forward order), loss events last."""
    def key(e: Event) -> tuple:
        idx = trace.layer_index(e.layer)
        return (e.step, 10**9 if idx is None else idx)
    return min(events, key=key)


_INSTABILITY = {(GRADIENT, "exploding"), (OPTIMIZER, "spike"), (OPTIMIZER, "divergence")}


def _phase(state: str, trace: Trace) -> str | tuple[str, ...]:
    """An at-init observation, or {it, 'later'} for families whose first step already
    contains an update (a GAN steps its discriminator before the generator's backward)."""
    return (state, "later") if trace.family in ALTERNATING_FAMILIES else state


def _every(trace: Trace) -> int:
    """The monitor's check interval (``every``), 1 when the trace does not say."""
    try:
        return max(1, int(dict(trace.meta).get("every", 1) or 1))
    except (TypeError, ValueError):
        return 1


def _is_init(step: int, trace: Trace) -> bool:
    return step < trace.first_step + INIT_STEPS * _every(trace)


def param_layers(trace: Trace) -> list[str]:
    """Monitored layers that own parameters (where gradient events can occur), forward order."""
    return [li.name for li in sorted(trace.layers, key=lambda x: x.index) if li.n_params > 0]


def relative_improvement(values: list[float]) -> float:
    """(median of the first ``LOSS_EDGE`` of the values - median of the last) / |first median|."""
    n = len(values)
    k = max(1, int(round(n * LOSS_EDGE)))
    head = sorted(values[:k])[k // 2]
    tail = sorted(values[-k:])[k // 2]
    if head == 0:
        return 0.0
    return (head - tail) / abs(head)


def extract(trace: Trace) -> Evidence:
    """Discretize ``trace`` into the evidence variables of the network."""
    obs: dict[str, str | tuple[str, ...]] = {}
    sup: dict[str, tuple[Event, ...]] = {}
    notes: dict[str, str] = {}
    events = list(trace.events)
    watched = bool(trace.layers)  # detectors ran on layers: absence of layer events is evidence
    grad_layers = param_layers(trace)
    types = {li.type for li in trace.layers}

    # -- gradients ---------------------------------------------------------------------
    expl = _kind(events, GRADIENT, "exploding")
    if expl:
        first = _first(expl, trace)
        obs["exploding"] = _phase("init", trace) if _is_init(first.step, trace) else "later"
        sup["exploding"] = tuple(expl)
        notes["exploding"] = f"first exploding gradients in {first.layer} at step {first.step}"
    elif grad_layers:
        obs["exploding"] = "absent"

    van = _kind(events, GRADIENT, "vanishing")
    if van:
        first = _first(van, trace)
        sup["vanishing"] = tuple(van)
        if _is_init(first.step, trace):
            obs["vanishing"] = _vanishing_signal(van, trace)
        else:
            obs["vanishing"] = "later"
        notes["vanishing"] = f"first vanishing gradients in {first.layer} at step {first.step} ({obs['vanishing']})"
    elif grad_layers:
        obs["vanishing"] = "absent"

    # -- activations -------------------------------------------------------------------
    sat = _kind(events, ACTIVATION, "saturated")
    if sat:
        first = _first(sat, trace)
        if _is_init(first.step, trace):
            early = [x for x in sat if _is_init(x.step, trace)]
            coupled = [x for x in early if any(_near(x, v, trace) and abs(v.step - x.step) <= COUPLING_STEPS
                                               for v in van)]
            state = "init_vanishing" if coupled else "init"
            obs["saturation"] = _phase(state, trace)
            sup["saturation"] = tuple(sat) + tuple(v for v in van if any(
                _near(x, v, trace) and abs(v.step - x.step) <= COUPLING_STEPS for x in coupled))
        else:
            obs["saturation"] = "later"
            sup["saturation"] = tuple(sat)
        notes["saturation"] = (f"saturated activations first in {first.layer} at step {first.step}"
                               + (", next to vanishing gradients" if obs["saturation"] == "init_vanishing" else ""))
    elif watched and types & BOUNDED_TYPES:
        obs["saturation"] = "absent"

    dead = _kind(events, ACTIVATION, "dead")
    if dead:
        first = _first(dead, trace)
        obs["dead"] = _phase("init", trace) if _is_init(first.step, trace) else "later"
        sup["dead"] = tuple(dead)
        notes["dead"] = f"dead units first in {first.layer} at step {first.step}"
    elif watched and types & RELU_TYPES:
        obs["dead"] = "absent"

    # -- data ----------------------------------------------------------------------------
    nan = _kind(events, DATA, "nan", "inf")
    if nan:
        first = _first(nan, trace)
        at_input = first.measured.get("at_input")
        inside = (at_input == 0.0) if at_input is not None else (trace.layer_index(first.layer) not in (0, None))
        if not inside:
            state, how = "input", "at the input"
        else:
            # a divergence event raised by the non-finite loss itself is the NaN, not a cause of it
            before = [e for e in events if (e.type, e.kind) in _INSTABILITY and e.step < first.step
                      and e.end_step >= first.step - SUDDEN_WINDOW and not e.measured.get("nonfinite")]
            state = "inside_after" if before else "inside_sudden"
            how = ("born inside the network after " + ", ".join(sorted({e.kind for e in before}))) if before \
                else "born inside the network out of a calm run"
        obs["data_nan"] = state
        sup["data_nan"] = tuple(nan)
        notes["data_nan"] = f"first {first.kind} {how} ({first.layer}) at step {first.step}"
    elif watched:
        obs["data_nan"] = "absent"

    shift = _kind(events, DATA, "shift")
    token_input = bool(trace.layers) and min(trace.layers, key=lambda li: li.index).type in TOKEN_INPUT_TYPES
    if shift:
        first = _first(shift, trace)
        at_input = trace.layer_index(first.layer) == 0 or first.measured.get("at_input", 0.0) == 1.0
        obs["data_shift"] = "input" if at_input else "inside"
        sup["data_shift"] = tuple(shift)
        notes["data_shift"] = f"input distribution shift at {first.layer}, step {first.step}"
    elif watched and (not token_input or (meta_float(trace, "token_watched") or 0) > 0):
        obs["data_shift"] = "absent"  # token ids are watched by their histogram (events/tokens.py)

    # -- loss ----------------------------------------------------------------------------
    start = _loss_start(trace)
    if start is not None:
        obs["loss_start"], notes["loss_start"] = start
    pattern, loss_events, note = _loss_pattern(trace, events)
    if pattern is not None:
        obs["loss_pattern"] = pattern
        sup["loss_pattern"] = tuple(loss_events)
        notes["loss_pattern"] = note

    # small gradients on a loss that keeps improving are not a vanishing signal: learning is
    # not stuck (attention query/key gradients at init, a loss converging near its floor)
    if "vanishing" in sup and obs.get("loss_pattern") == "decreasing":
        del obs["vanishing"]
        notes["vanishing"] += "; not evidence: the loss keeps improving"

    # -- signatures of the root causes themselves --------------------------------------
    sig_obs, sig_sup, sig_notes = signature_evidence(trace, events)
    obs.update(sig_obs)
    sup.update(sig_sup)
    notes.update(sig_notes)

    # -- order: exploding gradients vs loss instability --------------------------------
    unstable_loss = [e for e in events if e.type == OPTIMIZER and e.kind in ("spike", "divergence")]
    loss_step = min([e.step for e in unstable_loss], default=None)
    if trace.loss.first_nonfinite_step is not None:
        loss_step = min(loss_step, trace.loss.first_nonfinite_step) if loss_step is not None \
            else trace.loss.first_nonfinite_step
    if expl and loss_step is not None:
        g = min(e.step for e in expl)
        obs["order"] = "grad_first" if g < loss_step else ("same_step" if g == loss_step else "loss_first")
        sup["order"] = (_first(expl, trace),) + tuple(e for e in unstable_loss if e.step == loss_step)
        notes["order"] = f"exploding gradients at step {g}, loss instability at step {loss_step}"

    # -- structure -----------------------------------------------------------------------
    risk = depth_risk(trace)
    if risk is not None:
        obs["depth_risk"] = risk
        notes["depth_risk"] = _depth_note(trace, risk)
    return Evidence(obs, sup, notes)


def _vanishing_signal(van: list[Event], trace: Trace) -> str | tuple[str, ...]:
    """'init_uniform' when the vanishing layers' outputs are tiny too, else 'init_depth';
    both (a partial observation) when the events carry no output scale."""
    rms = sorted(e.measured["out_rms"] for e in van
                 if _is_init(e.step, trace) and "out_rms" in e.measured
                 and e.measured["out_rms"] == e.measured["out_rms"])
    if not rms:
        return ("init_depth", "init_uniform")
    return "init_uniform" if rms[len(rms) // 2] < SMALL_SIGNAL else "init_depth"


def _near(a: Event, b: Event, trace: Trace) -> bool:
    """Same or nearby layer (forward order) and overlapping step spans (within a lag)."""
    ia, ib = trace.layer_index(a.layer), trace.layer_index(b.layer)
    if ia is None or ib is None or abs(ia - ib) > COUPLING_LAYERS:
        return False
    return a.step <= b.end_step + COUPLING_STEPS and b.step <= a.end_step + COUPLING_STEPS


def _loss_pattern(trace: Trace, events: list[Event]) -> tuple[str | tuple[str, ...] | None, list[Event], str]:
    """The loss pattern (a state, a set of states, or None when no loss was recorded)."""
    loss = trace.loss
    opt = [e for e in events if e.type == OPTIMIZER]
    nonfinite = [e for e in opt if e.kind == "divergence" and e.measured.get("nonfinite", 0.0) > 0]
    if loss.n_nonfinite > 0 or nonfinite:
        step = loss.first_nonfinite_step if loss.first_nonfinite_step is not None else nonfinite[0].step
        return "nonfinite", nonfinite, f"non-finite loss from step {step}"
    div = [e for e in opt if e.kind == "divergence"]
    spikes = [e for e in opt if e.kind == "spike"]
    if trace.family in NON_MONOTONE_FAMILIES:
        return _game_pattern(trace, div, spikes)
    if div:
        return "divergence", div, f"loss diverges from step {div[0].step}"
    if spikes:
        return "spike", spikes, f"loss spike at step {spikes[0].step}"
    if loss.n == 0 and not opt:
        return None, [], ""
    plateau = [e for e in opt if e.kind == "plateau"]
    if plateau:
        return "flat", plateau, f"loss plateau from step {plateau[0].step}"
    vals = [v for _, v in loss.history if v == v and abs(v) != float("inf")]
    if loss.n < MIN_LOSS_POINTS or len(vals) < MIN_LOSS_POINTS // 2:
        return CALM_LOSS, [], f"only {loss.n} losses recorded: progress unknown"
    imp = relative_improvement(vals)
    if imp < FLAT_REL:
        return "flat", [], f"loss improved {imp:.1%} over the run"
    if imp < SLOW_REL:
        return "slow", [], f"loss improved only {imp:.1%} over the run"
    return "decreasing", [], f"loss improved {imp:.1%} over the run"


def _game_pattern(trace: Trace, div: list[Event], spikes: list[Event]) -> tuple[str | tuple[str, ...] | None,
                                                                              list[Event], str]:
    """The loss pattern of a two-player game or an RL objective: spikes and swings are the
    game, not instability; only a loss that leaves ``GAME_BAND`` times its starting level is
    a blow-up (the discriminator or the critic running away)."""
    rise = loss_rise(trace)
    if rise is None:
        if trace.loss.n == 0 and not (div or spikes):
            return None, [], ""
        return CALM_LOSS, [], "no loss instability (progress is not evidence for this family)"
    if rise >= GAME_BAND:
        return "divergence", div, f"loss left the game's band: {rise:.3g}x its starting level"
    return CALM_LOSS, [], (f"loss stays within {rise:.3g}x its starting level (swings are the game "
                           "here, progress is not evidence)")


def _loss_start(trace: Trace) -> tuple[str, str] | None:
    """('normal'|'high', note) from the first recorded loss against chance level ``ln K`` when
    the output size tells ``K``, else against the second half of the run."""
    hist = trace.loss.history
    if not hist or hist[0][0] != trace.first_step:
        return None
    chance = chance_loss(trace)
    if chance is not None and math.isfinite(hist[0][1]):
        ratio = hist[0][1] / chance
        state = "high" if ratio > START_CHANCE_FACTOR else "normal"
        return state, f"first loss {hist[0][1]:.3g} is {ratio:.3g}x chance level ln K = {chance:.3g}"
    vals = [v for _, v in hist if v == v and abs(v) != float("inf")]
    if len(vals) < MIN_START_POINTS or not (hist[0][1] == hist[0][1] and abs(hist[0][1]) != float("inf")):
        return None
    tail = sorted(vals[len(vals) // 2:])
    ref = tail[len(tail) // 2]
    head = hist[0][1]
    if ref <= 0 or head <= 0:  # the ratio is meaningless for objectives that cross zero
        return None
    ratio = head / ref
    state = "high" if ratio > START_FACTOR else "normal"
    return state, f"first loss {head:.3g} is {ratio:.3g}x the later median {ref:.3g}"


def depth_risk(trace: Trace) -> str | None:
    """Structural risk from the layer list: 'low', 'deep' or 'deep_saturating' (None: no layers)."""
    if not trace.layers:
        return None
    types = [li.type for li in trace.layers]
    n_norm = sum(t in NORM_TYPES for t in types)
    n_sat = sum(t in SATURATING_TYPES for t in types)
    n_param = sum(1 for li in trace.layers if li.n_params > 0 and li.type not in NORM_TYPES)
    if n_norm == 0 and n_sat >= SATURATING_DEPTH:
        return "deep_saturating"
    if n_norm == 0 and n_param >= DEEP_LAYERS:
        return "deep"
    return "low"


def _depth_note(trace: Trace, risk: str) -> str:
    types = [li.type for li in trace.layers]
    n_sat = sum(t in SATURATING_TYPES for t in types)
    n_param = sum(1 for li in trace.layers if li.n_params > 0 and li.type not in NORM_TYPES)
    n_norm = sum(t in NORM_TYPES for t in types)
    return f"{n_param} parameter layers, {n_sat} saturating activations, {n_norm} normalization layers ({risk})"
