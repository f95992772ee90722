"""Symptoms in the layers: exploding and vanishing gradients, saturated and dead activations.

Each reads the first event of its kind and when it started. A layer variable is **observed** when
the trace could have shown it -- gradient evidence needs monitored layers with parameters,
saturation a bounded activation module, dead units a ReLU module -- and unobserved otherwise (the
engine then marginalizes it): the absence of an event is evidence only where its detector ran.

Cut points (reasoning in ``docs/causal_model.md``):

* ``SMALL_SIGNAL`` -- at a vanishing onset at init, the median output RMS (``out_rms``) of the
  vanishing layers under which the forward signal is "small too" (``init_uniform``: every weight
  is small) rather than normal (``init_depth``: only the backward signal decays through depth).
  Default-initialized layers on normalized inputs output RMS 0.1..1; weights scaled down 100x
  or more land below 1e-2.
* ``COUPLING_LAYERS``/``COUPLING_STEPS`` -- saturation at init is "with vanishing" when a vanishing
  event starts at most ``COUPLING_STEPS`` steps from it, at most ``COUPLING_LAYERS`` layers away
  in forward order.
* ``LOSS_FLOOR`` -- saturation that starts 'later' is no evidence when the loss from its onset
  on (median) is at most this share of its reference (chance level ``ln K`` when known, else
  the run's own start): a classifier that confident (5 % of ``ln 2`` is a mean probability of
  0.966 on the right class) pins a bounded pooler or gate at its bounds by doing its job.
* Attention query/key projections (role ``"attn_qk"``, ``neuraldbg/monitor/roles.py``) whose
  vanishing starts at init are no evidence, whatever the loss does (:func:`qk_at_init`).

A run entered on trained weights (``started_trained``: a resume, a loaded state_dict, a
pre-trained model) has no "init" phase (:func:`at_init`): what its first monitored step shows was
made by the updates before the monitor, so an event present from that step reads "later" --
the onset phase of the training causes, never evidence about the initialization.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from neuraldbg.causal.nodes.floor import batch_gradients, head_level, median, trained_floor
from neuraldbg.causal.nodes.run import chance_loss, started_trained
from neuraldbg.causal.structure import NoisyMax, Reading
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import ACTIVATION, GRADIENT, Event
from neuraldbg.trace import Signature

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 10

SMALL_SIGNAL = 1e-2
COUPLING_LAYERS = 2
COUPLING_STEPS = 5
LOSS_FLOOR = 0.05

#: activation modules on which the monitor measures saturation / dead units: absence of those
#: events is evidence only when the model has such modules
BOUNDED_TYPES = frozenset({"Sigmoid", "Tanh", "Hardtanh", "Hardsigmoid", "Softsign", "Softmax"})
RELU_TYPES = frozenset({"ReLU", "ReLU6"})
#: bounded activations whose saturation at init reads ``init_softmax``: a softmax that is one-hot
#: before any update (attention rows, a probability head)
SOFTMAX_TYPES = frozenset({"Softmax", "Softmax2d", "Softmin"})
#: activation modules of torch (and, by the suffix, of libraries: ``GELUActivation``): a model
#: with none of them applies its activations as functions (``F.relu``), which no hook sees
ACTIVATION_TYPES = RELU_TYPES | BOUNDED_TYPES | frozenset({
    "ELU", "CELU", "SELU", "GELU", "GLU", "SiLU", "Mish", "LeakyReLU", "PReLU", "RReLU", "Softplus",
    "Softshrink", "Hardshrink", "Tanhshrink", "Threshold", "Hardswish", "LogSigmoid", "LogSoftmax",
    "Softmin", "Softmax2d"})
#: why dead units are not seen in a model whose activations are all functions: the monitor's
#: gap, not something the run failed to show
FUNCTIONAL_ACTIVATIONS = ("no activation module in this model, and no weight layer received a non-negative "
                          "input: activations applied as functions (F.relu) show no dead units here")
FUNCTIONAL_RELU_LAYERS = Signature(
    "functional_relu_layers", "integer", "run", "max",
    "weight layers of a model without activation modules that received a non-negative input (behind a "
    "ReLU-like function, whose dead units they then show as zero features)", lo=0)

SIGNATURES = (FUNCTIONAL_RELU_LAYERS,)


def functional_activations(layer_types: set[str]) -> bool:
    """Whether a model's activations are applied as functions: monitored layers, and no
    activation module among them. Pure."""
    acts = {t for t in layer_types if t in ACTIVATION_TYPES or t.endswith("Activation")}
    return bool(layer_types) and not acts


NO_GRADIENT_LAYER = "no monitored layer owns parameters"


#: what a layer event's note adds when the run was entered on trained weights and the event was
#: there from the monitor's first step
TRAINED_ENTRY = "; on entry to a run on trained weights: made by the updates before the monitor, not at initialization"


def at_init(view: TraceView, step: int) -> bool:
    """Whether ``step`` is at initialization: within the first checked steps
    (:meth:`TraceView.is_init`) of a run that started at initialization. On a run entered on
    trained weights no step is: its first monitored step already follows many updates, so an
    event there is read as 'later' -- its onset lies somewhere after them, as the training
    causes' 'later' says -- and never as evidence about the initialization."""
    return view.is_init(step) and started_trained(view.signatures) is None


def _entry_note(view: TraceView, step: int) -> str:
    """:data:`TRAINED_ENTRY` for an event at the first checked steps of a run entered on trained
    weights (why it reads 'later'), else nothing."""
    return TRAINED_ENTRY if view.is_init(step) and not at_init(view, step) else ""


def _onset(view: TraceView, events: list[Event], note: Callable[[Event], str]) -> Reading:
    """'init' (or {init, later} for alternating families) when the first event starts at init
    (:func:`at_init`), else 'later'; every event of the kind as support."""
    first = view.first(events)
    state = view.phase("init") if at_init(view, first.step) else "later"
    return Reading(state, tuple(events), note(first) + _entry_note(view, first.step))


def exploding(view: TraceView) -> Reading | None:
    """First exploding-gradient event, by onset phase."""
    expl = view.of_kind(GRADIENT, "exploding")
    if expl:
        r = _onset(view, expl, lambda f: f"first exploding gradients in {f.layer} at step {f.step}")
        if r.state == "later" and batch_gradients(expl, view.trace.loss.history, chance_loss(view.signatures),
                                                  trained_floor(view)):
            return Reading(None, r.support, r.note + "; not evidence: the gradients of batches a confident model "
                                                     "got wrong, its loss at its floor on the next ones",
                           reason="large gradients only on batches whose loss stayed below chance level and at its "
                                  "floor on the next ones are those batches' errors, not instability")
        return r
    return Reading("absent") if view.grad_layers else view.unwatched(NO_GRADIENT_LAYER, gradients=True)


def vanishing_signal(van: list[Event], view: TraceView) -> str | tuple[str, ...]:
    """'init_uniform' when the vanishing layers' outputs are tiny too, else 'init_depth';
    both (a partial observation) when the events carry no output scale."""
    rms = sorted(e.measured["out_rms"] for e in van
                 if at_init(view, e.step) and "out_rms" in e.measured
                 and e.measured["out_rms"] == e.measured["out_rms"])
    if not rms:
        return ("init_depth", "init_uniform")
    return "init_uniform" if rms[len(rms) // 2] < SMALL_SIGNAL else "init_depth"


def qk_at_init(events: list[Event], qk_layers: set[str], is_init: Callable[[int], bool]) -> set[str]:
    """The attention query/key layers (``qk_layers``) whose first vanishing event in ``events``
    starts at init: their small gradient is the near-uniform attention of an untrained model,
    by construction, and stays so until the scores learn -- whatever the loss does."""
    first: dict[str, int] = {}
    for e in events:
        if e.layer in qk_layers:
            first[e.layer] = min(first.get(e.layer, e.step), e.step)
    return {layer for layer, step in first.items() if is_init(step)}


def vanishing_events(view: TraceView) -> list[Event]:
    """The vanishing-gradient events that are evidence: all but those of attention query/key
    projections vanishing from init (:func:`qk_at_init`; roles from ``neuraldbg/monitor/roles.py``)."""
    van = view.of_kind(GRADIENT, "vanishing")
    qk = {li.name for li in view.trace.layers if li.role == "attn_qk"}
    if not qk or not van:
        return van
    # an untrained model's near-uniform attention: not on trained weights, whose attention learned
    excused = qk_at_init(van, qk, lambda step: at_init(view, step))
    return [e for e in van if e.layer not in excused]


def vanishing(view: TraceView) -> Reading | None:
    """First vanishing-gradient events, by onset phase and forward signal. Attention query/key
    projections small from init are left out (:func:`vanishing_events`); small gradients on a
    loss that keeps improving are no evidence: learning is not stuck (a loss converging near
    its floor)."""
    from neuraldbg.causal.nodes.loss import loss_pattern_of

    van = vanishing_events(view)
    if not van:
        return Reading("absent") if view.grad_layers else view.unwatched(NO_GRADIENT_LAYER, gradients=True)
    first = view.first(van)
    state = vanishing_signal(van, view) if at_init(view, first.step) else "later"
    note = f"first vanishing gradients in {first.layer} at step {first.step} ({state})" + _entry_note(view, first.step)
    if loss_pattern_of(view).state == "decreasing":
        return Reading(None, tuple(van), note + "; not evidence: the loss keeps improving",
                       reason="small gradients while the loss keeps improving are no sign of a stuck signal")
    return Reading(state, tuple(van), note)


def loss_at_floor(history: Sequence[tuple[int, float]], onset: int, chance: float | None) -> bool:
    """Whether the loss from step ``onset`` on sits at its floor: the median of its finite values
    (at least 3) at most ``LOSS_FLOOR`` x the reference -- ``chance`` (``ln K``) when known, else
    the median of the first ``LOSS_HEAD`` of the run. Pure."""
    vals = [v for _, v in history if math.isfinite(v)]
    after = [v for s, v in history if s >= onset and math.isfinite(v)]
    if len(after) < 3 or len(vals) < 3:
        return False
    ref = chance if chance is not None else head_level(vals)
    return ref > 0 and median(after) <= LOSS_FLOOR * ref


def saturation(view: TraceView) -> Reading | None:
    """Bounded activations pinned at their bounds, by onset; 'init_vanishing' when vanishing
    gradients start next to them (the deep-sigmoid signature). Saturation that starts later,
    once the loss sits at its floor (:func:`loss_at_floor`), is no evidence: a confident model."""
    sat = view.of_kind(ACTIVATION, "saturated")
    if not sat:
        if view.watched and view.layer_types & BOUNDED_TYPES:
            return Reading("absent")
        return view.unwatched("no bounded activation module (sigmoid, tanh, softmax...) is monitored")
    van = vanishing_events(view)
    first = view.first(sat)

    def near(a: Event, b: Event) -> bool:
        return view.near(a, b, COUPLING_LAYERS, COUPLING_STEPS) and abs(b.step - a.step) <= COUPLING_STEPS

    if at_init(view, first.step):
        early = [x for x in sat if at_init(view, x.step)]
        coupled = [x for x in early if any(near(x, v) for v in van)]
        types = {li.name: li.type for li in view.trace.layers}
        softmax = not coupled and all(types.get(x.layer) in SOFTMAX_TYPES for x in early)
        state = view.phase("init_vanishing" if coupled else "init_softmax" if softmax else "init")
        support = tuple(sat) + tuple(v for v in van if any(near(x, v) for x in coupled))
    else:
        state, support = "later", tuple(sat)
    extra = {"init_vanishing": ", next to vanishing gradients",
             "init_softmax": ": a softmax one-hot before any update, its logits too large for it"}
    note = (f"saturated activations first in {first.layer} at step {first.step}"
            + extra.get(state if isinstance(state, str) else state[0], "") + _entry_note(view, first.step))
    if state == "later" and loss_at_floor(view.trace.loss.history, first.step, chance_loss(view.signatures)):
        return Reading(None, support, note + "; not evidence: the loss is at its floor",
                       reason="saturation of a model whose loss sits at its floor is confidence, not instability")
    return Reading(state, support, note)


def dead(view: TraceView) -> Reading | None:
    """ReLU units never active, by onset phase."""
    ev = view.of_kind(ACTIVATION, "dead")
    if ev:
        return _onset(view, ev, lambda f: (f"dead units of a ReLU applied as a function, first seen as zero features "
                                           f"at the input of {f.layer} at step {f.step}" if f.measured.get("functional")
                                           else f"dead units first in {f.layer} at step {f.step}"))
    if view.watched and view.layer_types & RELU_TYPES:
        return Reading("absent")
    if view.watched and functional_activations(view.layer_types):
        # a ReLU applied as a function shows its dead units at the next weight layer's input
        # (neuraldbg/monitor/measurements/functional.py), where it left no negative value
        if view.signatures.number(FUNCTIONAL_RELU_LAYERS):
            return Reading("absent")
        return Reading(None, reason=FUNCTIONAL_ACTIVATIONS, gap=True)
    return view.unwatched("no ReLU module is monitored")


NODES = (
    NoisyMax(
        "exploding", ("absent", "later", "init"),
        leak={"later": 0.02, "init": 0.005},
        effects={
            "instability=training": {"later": 0.75, "init": 0.02},
            "instability=init": {"init": 0.75, "later": 0.15},
            "corruption=values": {"later": 0.55},
            "corruption=targets": {"later": 0.30},
            "numerics=overflow": {"later": 0.45, "init": 0.15},
        },
        why="First exploding-gradient event, by onset phase. Non-finite gradients from a "
            "NaN batch also read as exploding, hence the direct edge from corrupted values, and "
            "so do the infinite gradients of weights an overflow made non-finite. "
            "Targets that stop matching a model that had fitted them meet confident wrong "
            "predictions: the cross-entropy gradient (p - y) goes from near zero to near one, "
            "far above the baseline formed while the model fitted, hence the edge from "
            "corrupted targets.",
        extract=exploding,
    ),
    NoisyMax(
        "vanishing", ("absent", "later", "init_depth", "init_uniform"),
        leak={"later": 0.03, "init_depth": 0.01, "init_uniform": 0.005},
        effects={
            "signal_decay=depth": {"init_depth": 0.70, "init_uniform": 0.03, "later": 0.10},
            "signal_decay=uniform": {"init_uniform": 0.45, "init_depth": 0.35, "later": 0.05},
            "instability=training": {"later": 0.25},
            "instability=init": {"later": 0.20},
            "corruption=targets": {"later": 0.30},
        },
        why="First vanishing-gradient events, by onset phase and by what the forward signal "
            "does at onset: 'init_depth' when layer outputs keep a normal scale (only the "
            "backward signal decays through depth), 'init_uniform' when the outputs are tiny "
            "too (every weight is small; biases often keep outputs normal, hence the weight of "
            "'init_depth' under 'uniform'). Units killed by a blow-up stop gradients ('later'). "
            "Targets that stop matching their inputs (shuffled labels) leave nothing to fit: "
            "the model falls back to the label marginal, where the expected gradient is near "
            "zero, so gradients shrink far below their baseline later in the run.",
        extract=vanishing,
    ),
    NoisyMax(
        "saturation", ("absent", "later", "init", "init_vanishing", "init_softmax"),
        leak={"later": 0.03, "init": 0.01, "init_vanishing": 0.003, "init_softmax": 0.002},
        effects={
            "signal_decay=depth": {"init_vanishing": 0.45, "init": 0.10},
            "initialization=too_large": {"init": 0.30, "init_softmax": 0.30},
            "instability=init": {"init": 0.30, "init_vanishing": 0.10, "init_softmax": 0.10},
            "instability=training": {"later": 0.35},
            "data=shifted": {"later": 0.30},
        },
        why="Bounded activations (sigmoid, tanh, softmax) pinned at their bounds, by onset: "
            "from the first step (weights or depth), with vanishing gradients in the same or "
            "an adjacent layer (the deep-sigmoid signature), or only after updates / an input "
            "change ('later': e.g. attention collapse under a too-large step size). Weights too "
            "large push pre-activations into the tails from step 0 whether or not anything "
            "blows up (query/key weights too large: one-hot attention rows), hence the direct "
            "edge from the initialization besides the one through instability. A softmax "
            "one-hot before any update ('init_softmax': every saturated module at init a "
            "softmax) has logits too large for it from the start: an untrained attention "
            "spreads over its keys, an untrained head over its classes, whatever the data; "
            "it is told apart from the other bounded activations, which a large input "
            "also pins.",
        extract=saturation,
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
        extract=dead,
    ),
)
