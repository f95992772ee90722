"""The learning-rate schedule: its start (a warm-up, where that matters) and its course over the run.

The step size (``neuraldbg/causal/nodes/causes.py``) is read at the schedule's peak, so it cannot
see *when* the peak rate was applied. A deep post-norm transformer (LayerNorm after each residual
add: BERT, ``nn.TransformerEncoderLayer(norm_first=False)``) trained at a normal peak rate from
the very first step stalls or blows up, where the same model with a warm-up learns (Xiong et al.
2020, "On Layer Normalization in the Transformer Architecture": the gradients of the top
post-norm layers are large at initialization, and Adam's early estimates turn them into full
steps). A pre-norm or shallow model does not care. So:

* ``warmup`` -- "present" when the first checked step's rate is at most ``WARMUP_START`` of the
  schedule's peak, "absent" when the rate starts at its peak (``lr_first``, ``lr_peak``, measured
  by ``neuraldbg/monitor/measurements/schedule.py`` from the optimizer's ``param_groups``, host
  floats only). It is *observed only on a model with at least* ``POSTNORM_DEEP`` *post-norm
  attention blocks* (:func:`~neuraldbg.causal.nodes.depth.postnorm_depth`); elsewhere it is
  unobserved, so a healthy pre-norm or shallow run without warm-up carries no weight at all.

* ``lr_schedule`` -- the rate over the whole run, with the step of each change (``lr_collapse_step``,
  ``lr_jump_steps``, measured from the same ``param_groups`` reads). "collapsed": from some step on
  the rate stayed at or below ``COLLAPSE_SHARE`` of its peak so far, for at least
  ``COLLAPSE_SPAN`` of the run, while the loss over that span stayed at or above ``UNCONVERGED``
  of its reference (chance level ``ln K``, else the run's own start): the schedule, not the
  task, stopped the run (a ``StepLR`` stepped per batch instead of per epoch). "jumped": the rate
  rose at least ``JUMP_FACTOR``-fold within the measurement's window after having decayed from an
  earlier peak (a scheduler re-created or restarted mid-run), *and the loss answered*: the
  median of the ``RISE_POINTS`` losses after the jump is at least ``RISE_FACTOR`` times the
  median of those before it, and at least ``RISE_LEVEL`` of the reference. "steady" otherwise.
  Each state names its onset step through a derived loss event (a plateau from the collapse, a
  spike at the jump), so a hypothesis resting on it says when the schedule went wrong.

Cut points (reasoning in ``docs/causal_model.md``):

* ``COLLAPSE_SHARE`` -- 1e-3 of the peak: three decays of 10x. The usual step schedules end
  at 1e-2 (ResNet's 30/60 epochs of 90) or reach 1e-3 only over their last tenth (80 of 90
  epochs); at 1e-3 of its peak Adam moves each weight by 1e-3 of what it moved at the start, so
  a run that has not converged by then does not converge.
* ``COLLAPSE_SPAN`` -- a fifth of the run: a cosine or linear decay to zero spends its last
  2 % (cosine) or 0.1 % (linear) of steps under the cut, a per-batch ``StepLR`` most of the run.
* ``UNCONVERGED`` -- a quarter of chance level (or of the run's start): a run whose loss stands
  there has most of its way to its floor still ahead (the collapsed ConvNeXt stopped at 0.87 of
  chance, its twin went on to 0.05); one that reached its floor before its rate decayed reads
  "steady", whatever the rate did.
* ``JUMP_FACTOR``/``RISE_FACTOR``/``RISE_LEVEL`` -- a restart multiplies the rate by far more
  than 10 (SGDR restarts from near zero to the peak); what tells a re-created schedule from
  SGDR is the answer of the loss: SGDR's restarts return to a rate the model trained at and
  its loss moves little, a schedule (or an optimizer) restarted on trained weights throws the
  loss far above its level (3x and more, to at least a tenth of its reference; SGDR's restarts on the
  test MLP move it 0.8x, a schedule re-created with a cleared Adam state 3.3x).
* ``WARMUP_START`` -- a linear warm-up starts at 0 (``transformers``) or ``1/n`` of the peak (a
  ``LambdaLR`` ramp of ``n`` steps); a quarter of the peak is a ramp of at least four steps. A rate
  that starts higher has not waited for Adam's second-moment estimates.
* ``SCHEDULE_MIN_STEPS`` -- "absent" needs this many checked optimizer steps: one step cannot show a
  ramp (a run stopped at its first step, a monitor left at once).
* ``POSTNORM_DEEP`` -- post-norm stacks of 6 blocks or more need a warm-up at the usual rates
  (Xiong et al.: the 6-layer post-norm Transformer fails without it); the healthy post-norm models
  of both suites have 2 (BERT) and 4 (the plain encoder) blocks.
"""
from __future__ import annotations

import math
from typing import Sequence

from neuraldbg.causal.nodes.depth import postnorm_depth
from neuraldbg.causal.nodes.run import LR_PEAK, chance_loss, started_trained
from neuraldbg.causal.structure import Reading, Table
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import OPTIMIZER, Event
from neuraldbg.trace import Signature

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 45

WARMUP_START = 0.25
SCHEDULE_MIN_STEPS = 3
POSTNORM_DEEP = 6
COLLAPSE_SHARE = 1e-3
COLLAPSE_SPAN = 0.2
COLLAPSE_MIN_STEPS = 3
UNCONVERGED = 0.25
JUMP_FACTOR = 10.0
RISE_POINTS = 5
RISE_FACTOR = 3.0
RISE_LEVEL = 0.1

LR_FIRST = Signature("lr_first", "number", "window", "lead",
                     "the learning rate of the first checked optimizer step (largest over param groups)", lo=0)
LR_WARMUP_STEPS = Signature("lr_warmup_steps", "integer", "window", "lead",
                            "steps from the first checked optimizer step to the first that reached the peak "
                            "learning rate (0: the rate started at its peak)", lo=0)
LR_LAST = Signature("lr_last", "number", "run", "lead",
                    "the learning rate of the last checked optimizer step (the schedule's decay)", lo=0)
LR_CHECKED = Signature("lr_checked", "integer", "run", "lead",
                       "checked optimizer steps whose learning rate was read", lo=0)

LR_COLLAPSE_STEP = Signature("lr_collapse_step", "integer", "run", "lead",
                            "the checked step from which the learning rate stayed at or below COLLAPSE_SHARE of "
                            "its peak so far, to the last checked step", lo=0)
LR_JUMP_STEPS = Signature("lr_jump_steps", "integers", "run", "lead",
                          "checked steps at which the learning rate rose at least JUMP_FACTOR-fold within a few "
                          "checked steps after having decayed from an earlier peak (the first few)")
LR_JUMP_FROM = Signature("lr_jump_from", "integers", "run", "lead",
                         "for each of lr_jump_steps, the step after the last checked step before it: the rate "
                         "changed somewhere from there to the jump's checked step")
LR_JUMP_FACTOR = Signature("lr_jump_factor", "number", "run", "lead",
                           "the largest of those rises (new rate / the lowest rate just before it)", lo=0)

SIGNATURES = (LR_FIRST, LR_WARMUP_STEPS, LR_LAST, LR_CHECKED, LR_COLLAPSE_STEP, LR_JUMP_STEPS, LR_JUMP_FROM,
              LR_JUMP_FACTOR)


def warmup_state(first: float | None, peak: float | None, n_steps: int) -> str | None:
    """'present' (the rate starts at most ``WARMUP_START`` of its peak), 'absent' (it starts above
    that, seen over at least ``SCHEDULE_MIN_STEPS`` checked steps) or ``None`` (unknown: no rate
    read, a zero peak, or too few steps to tell). Pure."""
    if first is None or peak is None or peak <= 0:
        return None
    if first <= WARMUP_START * peak:
        return "present"
    return "absent" if n_steps >= SCHEDULE_MIN_STEPS else None


def warmup(view: TraceView) -> Reading | None:
    """Whether the learning rate was warmed up, read only on deep post-norm models."""
    sigs = view.signatures
    depth = postnorm_depth(view.trace.layers)
    if depth < POSTNORM_DEEP:
        return Reading(None, reason=f"the model has {depth} post-norm attention blocks (warm-up matters from "
                                    f"{POSTNORM_DEEP} on)")
    if started_trained(sigs):
        return Reading(None, reason="not at initialization: a warm-up happened before the monitor, if at all",
                       gap=True)
    first, peak = sigs.number(LR_FIRST), sigs.number(LR_PEAK)
    n = int(sigs.number(LR_CHECKED) or 0)
    state = warmup_state(first, peak, n)
    if first is None:
        return view.unmeasured(LR_FIRST, "no learning rate was read")
    if state is None or peak is None:
        return Reading(None, reason="too few checked optimizer steps (or a zero peak) to read the schedule")
    ramp = sigs.number(LR_WARMUP_STEPS)
    how = (f"rises to its peak {peak:.3g} over {int(ramp)} steps" if state == "present" and ramp
           else f"starts at {first:.3g}, {first / peak:.0%} of its peak {peak:.3g}")
    return Reading(state, (), f"the learning rate {how} (warm-up {state}) on {depth} post-norm attention blocks")


def _finite(history: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(s, v) for s, v in history if math.isfinite(v)]


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def loss_reference(history: Sequence[tuple[int, float]], chance: float | None) -> float | None:
    """What "far from the floor" is measured against: chance level ``ln K`` when known, else the
    median of the first tenth of the finite losses (at least 3); ``None`` when neither is
    positive. Pure."""
    if chance is not None and chance > 0:
        return chance
    vals = [v for _, v in _finite(history)]
    if len(vals) < 3:
        return None
    head = _median(vals[:max(3, len(vals) // 10)])
    return head if head > 0 else None


def collapse_state(collapse_step: int | None, first_step: int, last_step: int,
                   history: Sequence[tuple[int, float]], reference: float | None) -> tuple[bool, float | None]:
    """Whether the rate's collapse at ``collapse_step`` stopped a run that had not converged:
    ``(collapsed, level)`` where ``level`` is the median loss from the collapse on over
    ``reference``. Collapsed when the collapse spans at least ``COLLAPSE_SPAN`` of the run
    (``first_step``..``last_step``) and ``COLLAPSE_MIN_STEPS`` recorded losses, and the loss over
    it stays at or above ``UNCONVERGED`` of the reference. Pure."""
    if collapse_step is None or reference is None or last_step <= first_step:
        return False, None
    if (last_step - collapse_step) < COLLAPSE_SPAN * (last_step - first_step):
        return False, None
    after = [v for s, v in _finite(history) if s >= collapse_step]
    if len(after) < COLLAPSE_MIN_STEPS:
        return False, None
    level = _median(after) / reference
    return level >= UNCONVERGED, level


def jump_answered(jump_step: int, history: Sequence[tuple[int, float]], reference: float | None) -> float | None:
    """The loss's rise after a jump of the rate at ``jump_step``: the median of the
    ``RISE_POINTS`` finite losses after it over the median of the ``RISE_POINTS`` up to it,
    when that is at least ``RISE_FACTOR`` and the risen level at least ``RISE_LEVEL`` of
    ``reference`` (unchecked without one); ``None`` otherwise (no answer, or too few losses). Pure."""
    return _rise(_finite(history), jump_step, reference)


def _rise(vals: Sequence[tuple[int, float]], jump_step: int, reference: float | None) -> float | None:
    """:func:`jump_answered` on losses already filtered to the finite ones."""
    before = [v for s, v in vals if s <= jump_step][-RISE_POINTS:]
    after = [v for s, v in vals if s > jump_step][:RISE_POINTS]
    if len(before) < 2 or len(after) < RISE_POINTS:
        return None
    lo, hi = _median(before), _median(after)
    if lo <= 0 or hi < RISE_FACTOR * lo:
        return None
    if reference is not None and hi < RISE_LEVEL * reference:
        return None
    return hi / lo


def jump_onset(earliest: int, jump_step: int, history: Sequence[tuple[int, float]],
               reference: float | None) -> tuple[float, int] | None:
    """``(rise, onset)`` of a jump of the rate somewhere in ``[earliest, jump_step]`` (the checked
    steps around it bound it; one step apart at every=1): among the recorded steps there (and
    ``jump_step``), the onset whose :func:`jump_answered` rise is largest -- the loss is still at
    its level before the real onset and risen after it, so the contrast peaks there. ``None``
    when no candidate is answered. Pure."""
    vals = _finite(history)
    candidates = sorted({s for s, _ in history if earliest <= s <= jump_step} | {jump_step})
    best: tuple[float, int] | None = None
    for t in candidates:
        # the loss recorded at the onset step was computed before the update at the new rate
        rise = _rise(vals, t, reference)
        if rise is not None and (best is None or rise > best[0]):
            best = (rise, t)
    return best


def lr_schedule(view: TraceView) -> Reading | None:
    """The rate over the whole run: 'jumped' (and the loss answered), 'collapsed' (while the
    loss was still far from its floor) or 'steady'."""
    sigs = view.signatures
    # lr_checked is a run signature, unknown in a trace cut mid-run (the report's timeline): the
    # recorded losses below bound the run's length there
    n = sigs.number(LR_CHECKED)
    if sigs.number(LR_FIRST) is None:
        return view.unmeasured(LR_FIRST, "no learning rate was read")
    if n is not None and n < SCHEDULE_MIN_STEPS:
        return Reading(None, reason="too few checked optimizer steps to read the schedule")
    trace = view.trace
    hist = trace.loss.history
    if len(_finite(hist)) < 2 * RISE_POINTS:
        return Reading(None, reason="too few recorded losses to read what the schedule did to the run")
    ref = loss_reference(hist, chance_loss(sigs))
    jumps = sigs.value(LR_JUMP_STEPS) or ()
    starts = sigs.value(LR_JUMP_FROM) or ()
    for i, step in enumerate(jumps):
        earliest = int(starts[i]) if i < len(starts) else int(step)
        got = jump_onset(min(earliest, int(step)), int(step), hist, ref)
        if got is not None:
            rise, onset = got
            factor = sigs.number(LR_JUMP_FACTOR)
            how = f" {factor:.3g}x" if factor is not None else ""
            ev = Event(OPTIMIZER, "spike", None, onset, severity=rise,
                       values={"loss_rise": rise, "lr_jump": factor or 0.0})
            return Reading("jumped", (ev,), (f"the learning rate jumped{how} at step {onset} and the loss rose "
                                             f"{rise:.3g}x right after (a schedule restarted on trained weights)"))
    cstep = sigs.number(LR_COLLAPSE_STEP)
    cstep = int(cstep) if cstep is not None else None
    collapsed, level = collapse_state(cstep, trace.first_step, trace.last_step, hist, ref)
    peak = sigs.number(LR_PEAK)
    if collapsed and cstep is not None:
        ev = Event(OPTIMIZER, "plateau", None, cstep, end_step=max(cstep, trace.last_step), severity=level or 0.0,
                   values={"loss_level": level or 0.0, "lr_share": COLLAPSE_SHARE})
        at = f" of its peak {peak:.3g}" if peak is not None else " of its peak"
        return Reading("collapsed", (ev,), (f"the learning rate fell to {COLLAPSE_SHARE:g}{at} at step {cstep} "
                                            f"while the loss stood at {level:.2f}x its reference, and stayed there "
                                            "(the schedule, not the task, stopped the run)"))
    if cstep is not None and level is not None:
        note = f"the learning rate decayed below {COLLAPSE_SHARE:g} of its peak at step {cstep}, the loss at its floor"
    elif cstep is not None:
        note = f"the learning rate decayed below {COLLAPSE_SHARE:g} of its peak only at the end (step {cstep})"
    else:
        note = "the learning rate stayed within reach of its peak" + (
            "; its restarts left the loss at its level" if jumps else "")
    return Reading("steady", (), note)


def lr_schedule_of(view: TraceView) -> Reading | None:
    """:func:`lr_schedule` of ``view``, read once per view (other readings consult it)."""
    return view.memo("lr_schedule", lr_schedule)


def collapse_step_of(view: TraceView) -> int | None:
    """The step the rate collapsed at, when ``lr_schedule`` reads "collapsed" (read once per
    view): the run is then two regimes, and the readings of the whole run that assume one rate
    (``progress``, a calm ``loss_pattern``, the step size measured before the collapse) leave
    the part after it to this reading."""
    r = lr_schedule_of(view)
    return r.support[0].step if r is not None and r.state == "collapsed" and r.support else None


#: why a reading of the whole run is unobserved after a collapse of the rate (formatted with the step)
COLLAPSE_TWO_REGIMES = ("the learning rate collapsed at step {} with the loss far from its floor: the run is two "
                        "regimes, and lr_schedule reads the one the collapse stopped")


def two_regimes(view: TraceView) -> Reading | None:
    """The unobserved reading of a whole-run variable that assumes one rate, when the rate
    collapsed (:func:`collapse_step_of`); ``None`` when it did not."""
    c = collapse_step_of(view)
    return None if c is None else Reading(None, reason=COLLAPSE_TWO_REGIMES.format(c))


NODES = (
    Table(
        "warmup", ("present", "absent"), parents=("learning_rate",),
        rows=(
            ({"learning_rate": "too_high"}, (0.40, 0.60)),
            ({}, (0.995, 0.005)),
        ),
        why="Whether the learning rate started low and rose to its peak (a warm-up), read only on "
            "models with at least POSTNORM_DEEP post-norm attention blocks, where the peak rate "
            "applied from the first step is too high: the top post-norm layers' gradients are "
            "large at initialization, and the run stalls at chance or blows up (Xiong et al. "
            "2020). Elsewhere unobserved: a missing warm-up on a pre-norm or shallow model is "
            "no evidence. The step size, read at the peak, cannot see it.",
        extract=warmup,
    ),
    Table(
        "lr_schedule", ("steady", "collapsed", "jumped"), parents=("learning_rate",),
        rows=(
            ({"learning_rate": "too_low"}, (0.745, 0.25, 0.005)),
            ({"learning_rate": "too_high"}, (0.85, 0.01, 0.14)),
            ({}, (0.994, 0.003, 0.003)),
        ),
        why="The learning rate over the whole run, read from param_groups on checked steps. "
            "'collapsed': it stayed at or below COLLAPSE_SHARE of its peak over at least "
            "COLLAPSE_SPAN of the run while the loss was still at least UNCONVERGED of its "
            "reference: the rate, not the task, ended the learning (a StepLR stepped per batch). "
            "'jumped': it rose JUMP_FACTOR-fold after having decayed and the loss answered with a "
            "RISE_FACTOR rise (a schedule re-created mid-run). A too-low rate is mostly a "
            "constant one, so a collapse is a quarter of its runs; a too-high rate shows as a "
            "jump only when the monitor spans the restart. Healthy schedules (cosine or linear "
            "decay to zero, step decays per epoch, SGDR) read 'steady': a decay to zero spends "
            "under a fiftieth of the run below the cut, SGDR's restarts leave the loss near its "
            "level; the leaks cover a healthy run stopped early by a decay, and a restart on a "
            "batch that happened to be hard.",
        extract=lr_schedule_of,
    ),
)
