"""Symptoms of the data: NaN/Inf, a distribution shift, faults in the targets.

Cut points (reasoning in ``docs/causal_model.md``):

* ``SUDDEN_WINDOW`` -- a NaN/Inf born inside the network is "after" instability when an
  exploding-gradient, spike or divergence event was active within this many steps before it,
  "sudden" otherwise (overflow builds up; a malformed sample does not).
* ``TOKEN_INPUT_TYPES`` -- when the first monitored layer is one of these (token ids in), the
  input distribution is that of the ids: ``data_shift`` is observed only once the token watch
  (``neuraldbg/monitor/measurements/tokens.py``) has built its warm-up reference (``token_watched``).
* ``RISE``/``RISE_Z``/``BACK``/``CEILING`` -- "back to chance": the last ``LOSS_TAIL`` of the run
  sits between ``BACK`` and ``CEILING`` x the reference level (shuffled labels return a classifier
  to ``ln K``, not above it), and above the lowest level the loss had reached before by at least
  ``RISE`` x the reference and ``RISE_Z`` x the loss's own batch-to-batch noise. What it gave back
  is measured against what it had learned and its noise, not against a fixed depth: a LoRA
  fine-tune or a convolution net that learned to 0.8x chance before its labels were shuffled
  gave back as plainly as one that learned to 0.3x (both suites: shuffled labels rise 9-160x
  their noise and at least 0.085x chance; no other run in a back-to-chance window rises more
  than 1.4x its noise but for collapses under a learning rate far too high, which the
  ``instability`` parent explains).
* ``INPUT_RMS_LARGE`` -- an input feature (a channel for a convolution) whose RMS at the entry
  layer exceeds 10 on some checked step is off the unit scale a standard initialization assumes:
  healthy inputs of both suites (normalized images, tabular z-scores, RL observations, GNN
  features, diffusion's noisy samples) sit at RMS 0.5..1.5, raw 0-255 pixels at 40..130 (40 on
  a mostly dark image) and a column in other units (x1000) far above; 10 is near the geometric
  middle of 1.5 and 60, ten times the unit scale (``docs/causal_model.md``).
"""
from __future__ import annotations

import math
from typing import Sequence

from neuraldbg.causal.nodes.floor import median
from neuraldbg.causal.nodes.loss import MIN_LOSS_POINTS
from neuraldbg.causal.nodes.numerics import first_nonfinite
from neuraldbg.causal.nodes.run import chance_loss, started_trained
from neuraldbg.causal.structure import NoisyMax, Precondition, Reading, Table
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import DATA, GRADIENT, OPTIMIZER
from neuraldbg.trace import Signature
from neuraldbg.vocab import has_trait

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 20

SUDDEN_WINDOW = 5
RISE = 0.05
RISE_Z = 5.0
BACK = 0.85
CEILING = 1.5
LOSS_TAIL = 0.2

#: first-layer types that take integer token ids (no float input to watch for shifts)
TOKEN_INPUT_TYPES = frozenset({"Embedding", "EmbeddingBag"})

TOKEN_WATCHED = Signature("token_watched", "integer", "window", "max",
                          "embeddings whose token-id reference is built (a token shift is then observable)", lo=0)
INPUT_RMS_LARGE = 10.0

INPUT_RMS_MAX = Signature("input_rms_max", "number", "run", "max",
                          "the largest per-feature RMS of the model input at its entry weight layers, over the "
                          "checked steps", lo=0)
INPUT_RMS_FIRST = Signature("input_rms_first", "number", "window", "max",
                            "the largest per-feature RMS of the model input at its entry weight layers on the first "
                            "measured step", lo=0)
INPUT_ABS_MAX = Signature("input_abs_max", "number", "run", "max",
                          "the largest |x| of the model input at its entry weight layers", lo=0)
INPUT_FEATURES = Signature("input_features", "integer", "run", "max",
                           "input features (channels) measured at the entry weight layers", lo=0)
INPUT_OFF_SCALE = Signature("input_off_scale", "text", "run", "lead",
                            "the input features whose RMS is above the cut, named layer[index], largest first")
INPUT_NORMALIZED_AT = Signature("input_normalized_at", "text", "entry", "lead",
                                "the normalization layer that reads the model input first (its raw scale then "
                                "reaches no weight)")
SIGNATURES = (TOKEN_WATCHED, INPUT_RMS_MAX, INPUT_RMS_FIRST, INPUT_ABS_MAX, INPUT_FEATURES, INPUT_OFF_SCALE,
              INPUT_NORMALIZED_AT)

_INSTABILITY = {(GRADIENT, "exploding"), (OPTIMIZER, "spike"), (OPTIMIZER, "divergence")}


def _unstable_before(view: TraceView, step: int) -> list:
    """Instability events active within ``SUDDEN_WINDOW`` steps before ``step`` (a divergence
    event raised by the non-finite loss itself is the NaN, not a cause of it)."""
    return [e for e in view.events if (e.type, e.kind) in _INSTABILITY and e.step < step
            and e.end_step >= step - SUDDEN_WINDOW and not e.measured.get("nonfinite")]


def data_nan(view: TraceView) -> Reading | None:
    """First NaN/Inf by birthplace: at the input; born inside the network (after instability, or
    out of a calm run); or born in the gradients or the optimizer's update while everything
    before them was finite (:func:`~neuraldbg.causal.nodes.numerics.first_nonfinite`)."""
    nan = view.of_kind(DATA, "nan", "inf")
    born = first_nonfinite(view)
    if born is not None and born[0] in ("backward", "update"):
        where = "the gradients" if born[0] == "backward" else "the optimizer's update (weights finite before it)"
        before = _unstable_before(view, born[1])
        if before:
            # a blow-up the update or the backward only finished: the same reading as a NaN born
            # inside after instability (weights grown past 1e19 also read as non-finite there)
            return Reading("inside_after", tuple(nan), f"first non-finite value born in {where} at step {born[1]}, "
                                                       f"after {', '.join(sorted({e.kind for e in before}))}")
        return Reading(born[0], tuple(nan), f"first non-finite value born in {where} at step {born[1]}, with the "
                                            "inputs, the layer outputs and the loss finite")
    if not nan:
        return Reading("absent") if view.watched else view.unwatched("no layer was monitored")
    first = view.first(nan)
    at_input = first.measured.get("at_input")
    inside = (at_input == 0.0) if at_input is not None else (view.trace.layer_index(first.layer) not in (0, None))
    if not inside:
        state, how = "input", "at the input"
    else:
        before = _unstable_before(view, first.step)
        state = "inside_after" if before else "inside_sudden"
        how = ("born inside the network after " + ", ".join(sorted({e.kind for e in before}))) if before \
            else "born inside the network out of a calm run"
    return Reading(state, tuple(nan), f"first {first.kind} {how} ({first.layer}) at step {first.step}")


def data_shift(view: TraceView) -> Reading | None:
    """A shift of the input distribution against its warm-up, at the input or only inside."""
    shift = view.of_kind(DATA, "shift")
    trace = view.trace
    if shift:
        first = view.first(shift)
        at_input = trace.layer_index(first.layer) == 0 or first.measured.get("at_input", 0.0) == 1.0
        return Reading("input" if at_input else "inside", tuple(shift),
                       f"input distribution shift at {first.layer}, step {first.step}")
    if not view.watched:
        return view.unwatched("no layer was monitored")
    first = view.signatures.number(INPUT_RMS_FIRST)
    if input_scale_state(first) == "large":
        # the warm-up reference was built on off-scale data: "no shift against it" says nothing
        return Reading(None, reason=f"the input is off-scale from the first step (feature RMS {first:.3g}): a shift "
                                    "against its own warm-up cannot show")
    token_input = min(trace.layers, key=lambda li: li.index).type in TOKEN_INPUT_TYPES
    if token_input and not (view.signatures.number(TOKEN_WATCHED) or 0) > 0:
        return Reading(None, reason="token ids are read by their histogram, whose reference was not built yet")
    return Reading("absent")


def input_scale_state(rms_max: float | None) -> str | None:
    """'normal' or 'large' from the largest per-feature input RMS (``None``: not measured). Pure."""
    if rms_max is None:
        return None
    return "large" if rms_max > INPUT_RMS_LARGE else "normal"


def input_scale(view: TraceView) -> Reading | None:
    """The input's absolute scale at its entry weight layers against the unit scale that
    standard initializations assume: off-scale from the first step on is a shift no warm-up
    comparison sees."""
    sigs = view.signatures
    rms = sigs.number(INPUT_RMS_MAX)
    state = input_scale_state(rms)
    if state is None:
        norm = sigs.value(INPUT_NORMALIZED_AT)
        if norm:
            return Reading(None, reason=f"the model input is normalized first ({norm}): its raw scale reaches "
                                        "no weight")
        return view.unmeasured(INPUT_RMS_MAX, "no float input reached a weight layer directly (token ids and "
                                              "other integer inputs have no scale)")
    if state == "normal":
        return Reading("normal", (), f"input features at RMS {rms:.3g} at most (unit scale expected)")
    bad = sigs.value(INPUT_OFF_SCALE) or f"largest feature RMS {rms:.3g}"
    return Reading("large", (), f"the input is off the unit scale its first layer's initialization assumes "
                                f"(RMS above {INPUT_RMS_LARGE:g}: {bad})")


def back_to_chance(values: Sequence[float], reference: float) -> bool:
    """Whether a loss curve learned and then went back to ``reference``: its last ``LOSS_TAIL``
    between ``BACK`` and ``CEILING`` x ``reference``, and above the lowest level it had reached
    before by at least ``RISE`` x ``reference`` and ``RISE_Z`` x its median batch-to-batch change
    in that tail (medians of short windows, so a single noisy point decides nothing). A loss far
    *above* its chance level is a blow-up, not labels that stopped matching. Pure: finite floats
    in."""
    n = len(values)
    if n < MIN_LOSS_POINTS or reference <= 0:
        return False
    w = max(3, n // 20)
    tail_start = n - max(w, int(n * LOSS_TAIL))
    lows = [median(values[i:i + w]) for i in range(0, max(1, tail_start - w + 1))]
    tail_values = values[tail_start:]
    tail = median(tail_values)
    if not BACK * reference < tail < CEILING * reference:
        return False
    rise = tail - min(lows)
    noise = median([abs(b - a) for a, b in zip(tail_values, tail_values[1:])])
    return rise >= RISE * reference and rise >= RISE_Z * noise


def target_fault_of(view: TraceView) -> Reading | None:
    """:func:`target_fault` of ``view``, read once per view (``loss_pattern`` and ``progress``
    consult it: a return to chance is read by this node only)."""
    return view.memo("target_fault", target_fault)


def target_fault(view: TraceView) -> Reading | None:
    """Faults in the targets the input statistics cannot see: a loss turned non-finite while the
    run was calm and every monitored input and output finite, or a return to chance level."""
    trace, events = view.trace, view.events
    loss = trace.loss
    if loss.n == 0:
        return Reading(None, reason="no loss was recorded")
    s = loss.first_nonfinite_step
    if s is not None:
        data_before = [e for e in events if e.type == DATA and e.kind in ("nan", "inf") and e.step <= s]
        unstable = [e for e in events if e.step < s and ((e.type, e.kind) == (GRADIENT, "exploding") or (
            e.type == OPTIMIZER and e.kind in ("spike", "divergence") and not e.measured.get("nonfinite")))]
        if data_before or unstable:
            return Reading("absent")
        seen = s if trace.cadence is None else trace.cadence.next_checked(s)
        if seen != s:
            # an unchecked step showed no input or output; what the next check shows may already
            # be the non-finite loss's own doing (its update poisons the weights)
            return Reading(None, reason=f"the loss turned non-finite at step {s}, which was not checked: whether "
                                        f"its inputs and layer outputs were finite is unknown (the next check was "
                                        f"step {seen})", gap=True)
        return Reading("nonfinite_loss_first", (),
                       f"the loss turned non-finite at step {s} while inputs and layer outputs were finite")
    if has_trait(trace.family, "non_monotone"):
        return Reading(None, reason=f"a {trace.family} loss does not fall monotonically: a return to chance "
                                    "means nothing")
    vals = [v for _, v in loss.history if math.isfinite(v)]
    if len(vals) < MIN_LOSS_POINTS:
        return Reading(None, reason=f"fewer than {MIN_LOSS_POINTS} finite losses recorded")
    head = median(vals[:max(3, len(vals) // 20)])
    chance = chance_loss(view.signatures)
    if started_trained(view.signatures):
        # a resumed or pre-trained run starts far below chance: its own start is no chance level,
        # and a fine-tune that hovers near it would read as a return to it
        if chance is None:
            return Reading(None, reason="the run started trained and its chance level is unknown: its first "
                                        "loss is no chance level to return to")
        ref = chance
    else:
        # a start near ln K says the loss is a cross-entropy at chance: measure returns against that
        ref = chance if chance is not None and abs(head - chance) < 0.5 * chance else head
    if ref > 0 and back_to_chance(vals, ref):
        return Reading("back_to_chance", (), f"the loss learned, then went back to its chance level {ref:.3g}")
    return Reading("absent")


NODES = (
    NoisyMax(
        "data_nan", ("absent", "inside_after", "inside_sudden", "backward", "update", "input"),
        leak={"inside_after": 0.003, "inside_sudden": 0.003, "input": 0.001, "backward": 0.001, "update": 0.0005},
        effects={
            "corruption=values": {"input": 0.80, "inside_sudden": 0.15},
            "instability=training": {"inside_after": 0.30, "inside_sudden": 0.05, "backward": 0.02,
                                     "update": 0.01},
            "instability=init": {"inside_after": 0.15, "inside_sudden": 0.15, "backward": 0.02},
            "numerics=overflow": {"update": 0.45, "inside_sudden": 0.20, "backward": 0.15, "inside_after": 0.10},
        },
        why="First NaN/Inf by birthplace: at the model's input boundary (the data carried it "
            "in); born inside after gradients or loss were already growing (a blow-up); born "
            "inside out of a healthy run (a malformed sample reaching the net by another path: an "
            "all-masked attention row, a sub-network's own input; or an fp16 activation out of "
            "range); born in the gradients while the forward and the loss were finite; or born "
            "in the optimizer's update, the weights finite before it (an Adam eps that rounds "
            "to zero in fp16, eps=0: a 0/0). The last two are the run's own numbers, not data.",
        extract=data_nan,
    ),
    NoisyMax(
        "data_shift", ("absent", "inside", "input"),
        leak={"inside": 0.03, "input": 0.01},
        effects={
            "data=shifted": {"input": 0.85},
            "corruption=values": {"input": 0.12},
            "instability=training": {"inside": 0.30},
            "instability=init": {"inside": 0.10},
        },
        why="Distribution shift of a layer's input against its own warm-up reference: at the "
            "input boundary (the data changed) or only inside (the weights changed).",
        extract=data_shift,
    ),
    NoisyMax(
        "input_scale", ("normal", "large"),
        leak={"large": 0.004},
        effects={
            "data=shifted": {"large": 0.5},
            "corruption=values": {"large": 0.02},
        },
        why="The model input's per-feature RMS at its entry weight layers (Linear, Conv, RNN) "
            "against the unit scale standard initializations assume: an absolute reading, so "
            "inputs off-scale from the first step on (raw pixels, unscaled columns) show, which "
            "the warm-up comparisons of data_shift cannot see. Unobserved when a normalization "
            "layer reads the input first, or the input is token ids.",
        extract=input_scale,
    ),
    Table(
        "target_fault", ("absent", "nonfinite_loss_first", "back_to_chance"),
        parents=("corruption", "data", "instability"),
        rows=(
            ({"corruption": "targets"}, (0.35, 0.01, 0.64)),
            ({"corruption": "values"}, (0.77, 0.22, 0.01)),
            ({"instability": "training"}, (0.93, 0.05, 0.02)),
            ({"instability": "init"}, (0.95, 0.03, 0.02)),
            ({"data": "shifted"}, (0.93, 0.02, 0.05)),
            ({}, (0.99, 0.004, 0.006)),
        ),
        why="Faults in the targets, which the input statistics cannot see: the loss turned "
            "non-finite while every monitored input and layer output at that step was finite "
            "(a NaN or Inf target), or the loss, after having learned, went back to its "
            "chance level and stayed there (labels shuffled or misaligned).",
        extract=target_fault_of,
    ),
)


def lacks_bad_data(view: TraceView) -> str | None:
    """Why the run shows nothing corrupted data produces (``None``: it shows something, or could
    not tell): no non-finite value anywhere, or the first one born in the gradients or the
    optimizer's update (the run's own numbers), and targets that read normal, both observed."""
    nan, targets = data_nan(view), target_fault_of(view)
    if nan is None or targets is None or targets.state != "absent":
        return None
    if nan.state == "absent":
        return "no NaN or Inf anywhere in the run, and the targets read normal"
    if nan.state in ("backward", "update"):
        born = first_nonfinite(view)
        where = "gradients" if nan.state == "backward" else "optimizer's update"
        return (f"the first non-finite value was born in the {where} (step {born[1] if born else '?'}) with every "
                "input and the loss finite, and the targets read normal")
    return None


PRECONDITIONS = (
    Precondition(
        "data", "corrupted", "non-finite values in the data or faulty targets", lacks_bad_data,
        why="Corrupted data shows as what it is: a NaN or Inf in a batch, or targets that stop matching their "
            "inputs. A plateau or exploding gradients alone are no sign of it (both are a learning rate's first).",
    ),
)
