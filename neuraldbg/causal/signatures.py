"""Evidence from the root causes' own signatures, read from a trace's measurements.

The symptom evidence of :mod:`neuraldbg.causal.evidence` (gradient sizes, loss shapes) is
what a failure *looks like*; the signatures here are what each cause *is*, measured
directly, so they hold on models whose symptoms look different from the zoo's:

* ``step_size`` -- the update-to-weight ratio ``||w_after - w_before|| / ||w_before||`` the
  optimizer took over its first measured steps, read at the run's peak learning rate
  (``step_ratio_peak``: the median layer; ``step_ratio_max``: the fastest layer; see
  :class:`neuraldbg.monitor.probes.StepSizeProbe`). The witness of ``learning_rate``.
* ``init_scale`` -- the weights' RMS at the first checked step against the nearest reference
  scale of their type and fan-in (``init_scale_log10``: the median over weight matrices of
  ``log10(rms / reference)``). The witness of ``initialization``.
  For low-rank adapters (LoRA) the reference is zero: ``adapter_ratio`` is the median over
  adapters of ``||B A|| / ||W||``, how much of its frozen layer each adapter rewrites before
  any update (:func:`neuraldbg.monitor.probes.adapter_scale`).
* ``target_fault`` -- the loss turned non-finite while every monitored input and output was
  finite and the run was calm, or it went back to chance level after having learned.
* ``retention`` -- with a reference loss (``NeuralDbg(..., reference=fn)``: a held-out batch
  of the task a fine-tune must keep), the share of its pre-trained margin to chance that the
  run gave up: ``(tail - first) / (ln K - first)`` from the value on entry to the median of
  the last quarter of the values (:class:`neuraldbg.monitor.reference.ReferenceLoss`).
* ``chance_loss`` (used by ``loss_start`` and ``retention``) -- ``ln K`` for a ``K``-way output
  (``out_features`` of the last linear layer in forward order), a start reference that does
  not depend on how well training later went.

Cut points (module constants, reasoning in ``docs/causal_model.md``):

* ``STEP_TINY``/``STEP_LARGE`` -- healthy runs of both suites take 0.005..0.1 per step (the
  median layer; the fastest layer 0.008..0.13), SGD and Adam alike. Below
  ``STEP_TINY`` in *every* layer the weights cannot move measurably in thousands of steps;
  above ``STEP_LARGE`` in the median layer every step rewrites a fifth of each weight matrix.
  Between ``STEP_ELEVATED`` and ``STEP_LARGE`` is "elevated": five times the textbook 1e-2, where
  small models with large learning rates still train but a fine-tune forgets and a GAN's
  players overshoot; weaker evidence, whose weight each family's fitted table decides.
* ``INIT_LOG10_CUT`` -- healthy models of both suites sit within 0.05 (log10) of a reference
  scale; ``0.5`` is a factor of 3.2 off *every* reference of the layer, ten times that band.
* ``ADAPTER_LARGE`` -- LoRA zero-initializes ``B`` so fine-tuning starts at the pre-trained
  function (ratio exactly 0, as in every healthy adapter of both suites); an adapter that
  starts at half the norm of the layer it adapts has replaced a large part of it at step 0.
* ``LEARNED``/``BACK``/``CEILING`` -- "back to chance": the loss had fallen below ``LEARNED`` x
  its reference level, and the last ``LOSS_TAIL`` of the run sits between ``BACK`` and
  ``CEILING`` x the reference (shuffled labels return a classifier to ``ln K``, not above it).
* ``RETENTION_PARTIAL``/``RETENTION_LOST`` -- a quarter and a half of the margin between the
  reference's starting loss and chance: the zoo's healthy LoRA fine-tunes give up 0.10..0.17
  (15 runs), so "partial" is half again the top of that and "lost" means that half of what
  pre-training taught is gone. Without a chance level above the start (an unknown output size, a loss that
  is not a cross-entropy), the margin is the starting loss itself (lost: +50%).
* ``START_CHANCE_FACTOR`` -- ``loss_start`` is "high" when the first loss is above this many
  times ``ln K``: an untrained classifier starts near ``ln K`` however fast it then learns.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from neuraldbg.events.base import DATA, GRADIENT, OPTIMIZER, Event
from neuraldbg.trace import Trace

STEP_TINY = 1e-4
STEP_ELEVATED = 0.05
STEP_LARGE = 0.2
INIT_LOG10_CUT = 0.5
ADAPTER_LARGE = 0.5
LEARNED = 0.6
BACK = 0.85
CEILING = 1.5
LOSS_TAIL = 0.2
#: fewer recorded losses than this: progress (and a return to chance) is unknowable
MIN_LOSS_POINTS = 20
START_CHANCE_FACTOR = 4.0
RETENTION_PARTIAL = 0.25
RETENTION_LOST = 0.5
#: reference values below which retention is not read (the first one and a tail)
MIN_REFERENCE_POINTS = 3
#: GAN and RL losses swing with the game; a loss this many times its start is a blow-up
GAME_BAND = 50.0
LOSS_HEAD = 0.1
MIN_RISE_POINTS = 10

#: families whose loss is not minimized monotonically: loss progress is not evidence there,
#: and "back to chance" means nothing
NON_MONOTONE_FAMILIES = ("gan", "rl")


def meta_float(trace: Trace, key: str) -> float | None:
    """A finite number stored in ``trace.meta`` under ``key``, else ``None``."""
    v = dict(trace.meta).get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def step_size_state(peak_ratio: float | None, max_ratio: float | None = None) -> str | None:
    """'normal', 'tiny', 'elevated' or 'large' from the peak update ratios (``None``: not
    measured).

    "Tiny" reads the largest ratio of *any* layer: vanishing gradients shrink the updates of the
    input-side layers under plain SGD, but the output side still moves; a learning rate that
    is too low holds every layer still. "Large" reads the median over layers, so one layer
    with near-zero weights (a fresh bias, a norm offset) cannot make a whole run look large.
    """
    if peak_ratio is None:
        return None
    top = peak_ratio if max_ratio is None else max(max_ratio, peak_ratio)
    if top < STEP_TINY:
        return "tiny"
    if peak_ratio > STEP_LARGE:
        return "large"
    if peak_ratio > STEP_ELEVATED:
        return "elevated"
    return "normal"


def init_scale_state(log10_factor: float | None) -> str | None:
    """'normal', 'small' or 'large' from the median log10 weight-scale factor."""
    if log10_factor is None:
        return None
    if log10_factor < -INIT_LOG10_CUT:
        return "small"
    if log10_factor > INIT_LOG10_CUT:
        return "large"
    return "normal"


def chance_loss(trace: Trace) -> float | None:
    """``ln K`` of the model's ``K``-way output (``None`` when unknown or ``K < 2``)."""
    k = meta_float(trace, "out_features")
    return math.log(k) if k is not None and k >= 2 else None


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def back_to_chance(values: Sequence[float], reference: float) -> bool:
    """Whether a loss curve fell below ``LEARNED`` x ``reference`` and then went back to it:
    its last ``LOSS_TAIL`` between ``BACK`` and ``CEILING`` x ``reference`` (medians of short
    windows, so a single noisy point decides nothing). A loss far *above* its chance level is
    a blow-up, not labels that stopped matching. Pure: finite floats in."""
    n = len(values)
    if n < MIN_LOSS_POINTS or reference <= 0:
        return False
    w = max(3, n // 20)
    tail_start = n - max(w, int(n * LOSS_TAIL))
    lows = [_median(values[i:i + w]) for i in range(0, max(1, tail_start - w + 1))]
    tail = _median(values[tail_start:])
    return min(lows) < LEARNED * reference and BACK * reference < tail < CEILING * reference


def target_fault(trace: Trace, events: list[Event]) -> tuple[str | None, tuple[Event, ...], str]:
    """(state or None when unobservable, supporting events, note) of ``target_fault``."""
    loss = trace.loss
    if loss.n == 0:
        return None, (), ""
    s = loss.first_nonfinite_step
    if s is not None:
        data_before = [e for e in events if e.type == DATA and e.kind in ("nan", "inf") and e.step <= s]
        unstable = [e for e in events if e.step < s and ((e.type, e.kind) == (GRADIENT, "exploding") or (
            e.type == OPTIMIZER and e.kind in ("spike", "divergence") and not e.measured.get("nonfinite")))]
        if not data_before and not unstable:
            return ("nonfinite_loss_first", (),
                    f"the loss turned non-finite at step {s} while inputs and layer outputs were finite")
        return "absent", (), ""
    if trace.family in NON_MONOTONE_FAMILIES:
        return None, (), ""
    vals = [v for _, v in loss.history if math.isfinite(v)]
    if len(vals) < MIN_LOSS_POINTS:
        return None, (), ""
    head = _median(vals[:max(3, len(vals) // 20)])
    chance = chance_loss(trace)
    # a start near ln K says the loss is a cross-entropy at chance: measure returns against that
    ref = chance if chance is not None and abs(head - chance) < 0.5 * chance else head
    if ref > 0 and back_to_chance(vals, ref):
        return "back_to_chance", (), f"the loss learned, then went back to its chance level {ref:.3g}"
    return "absent", (), ""


def retention_fraction(first: float, tail: float, chance: float | None) -> float | None:
    """Share of the reference's margin given up: ``(tail - first) / (chance - first)``, or
    ``(tail - first) / first`` without a chance level above ``first`` (None when neither
    margin is positive). Negative when the reference improved. Pure."""
    margin = chance - first if chance is not None and chance > first else first
    return (tail - first) / margin if margin > 0 else None


def retention_state(fraction: float | None) -> str | None:
    """'kept', 'partial' or 'lost' from :func:`retention_fraction` (None: not measured)."""
    if fraction is None:
        return None
    if fraction > RETENTION_LOST:
        return "lost"
    return "partial" if fraction > RETENTION_PARTIAL else "kept"


def retention_not_kept(state: str | None) -> bool:
    """Whether an observed ``retention`` state says the run gave up part of its reference
    (then the reference is a symptom: a hypothesis' sentence, verification's outcome)."""
    return state in ("partial", "lost")


def retention(trace: Trace) -> tuple[str | None, str]:
    """(state or None, note) of the ``retention`` signature of ``trace``."""
    first, tail = meta_float(trace, "reference_first"), meta_float(trace, "reference_tail")
    n = meta_float(trace, "reference_n") or 0
    if first is None or tail is None or n < MIN_REFERENCE_POINTS:
        return None, ""
    chance = chance_loss(trace)
    frac = retention_fraction(first, tail, chance)
    state = retention_state(frac)
    if state is None:
        return None, ""
    to = f"chance ({chance:.3g})" if chance is not None and chance > first else "its own start"
    return state, (f"the reference loss went from {first:.3g} to {tail:.3g}: {frac:.0%} of its margin to "
                   f"{to} given up ({state})")


def signature_evidence(trace: Trace, events: list[Event]) -> tuple[dict[str, Any], dict[str, tuple[Event, ...]],
                                                                   dict[str, str]]:
    """Observations, support and notes of the signature variables of ``trace``."""
    obs: dict[str, Any] = {}
    sup: dict[str, tuple[Event, ...]] = {}
    notes: dict[str, str] = {}
    peak, top = meta_float(trace, "step_ratio_peak"), meta_float(trace, "step_ratio_max")
    state = step_size_state(peak, top)
    if state is not None:
        obs["step_size"] = state
        notes["step_size"] = (f"peak update/weight ratio {peak:.3g} per step (median over layers"
                              + (f", {top:.3g} in the fastest layer" if top is not None else "") + f"; {state})")
    f = meta_float(trace, "init_scale_log10")
    state = init_scale_state(f)
    if state is not None:
        obs["init_scale"] = state
        notes["init_scale"] = f"weights {10 ** f:.3g}x their reference scale at the first step ({state})"
    a = meta_float(trace, "adapter_ratio")
    if a is not None and a > ADAPTER_LARGE:  # adapters' reference is zero: B = 0 at the start
        obs["init_scale"] = "large"
        notes["init_scale"] = (f"low-rank adapters start at {a:.3g}x the norm of the frozen layers they "
                               "adapt (LoRA starts at 0: B = 0)")
    state, note = retention(trace)
    if state is not None:
        obs["retention"], notes["retention"] = state, note
    state, support, note = target_fault(trace, events)
    if state is not None:
        obs["target_fault"] = state
        sup["target_fault"] = support
        if note:
            notes["target_fault"] = note
    return obs, sup, notes


def loss_rise(trace: Trace) -> float | None:
    """Largest finite ``|loss|`` over the median ``|loss|`` of the first ``LOSS_HEAD`` of the run
    (None with fewer than ``MIN_RISE_POINTS`` finite losses or a zero start)."""
    vals = [abs(v) for _, v in trace.loss.history if v == v and abs(v) != float("inf")]
    if len(vals) < MIN_RISE_POINTS:
        return None
    head = sorted(vals[:max(1, int(len(vals) * LOSS_HEAD))])
    ref = head[len(head) // 2]
    return max(vals) / ref if ref > 0 else None
