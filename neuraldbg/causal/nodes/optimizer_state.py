"""The optimizer's own state on entry: whether a resumed run brought its optimizer along.

A checkpoint holds the weights, the optimizer's state (Adam's moments and its step count) and
the scheduler's position. A run restored from the weights alone starts trained weights under a
fresh Adam -- no second moments, so its first updates are full-size steps of about the rate in
every coordinate -- and, with the scheduler re-created, at the schedule's peak rather than where
it stopped. A model that sat at its floor is thrown off it: the loss jumps right after the
resume and stays far above where it started. That is a learning rate too high *for these
weights*, which the step size (read against the weights' own scale) and the schedule's shape
(a cosine from its peak, as a fresh run has) do not show.

* ``optimizer_restart`` -- "shock" when the run started on trained weights (``started_trained``)
  under an adaptive optimizer whose state was empty (``optimizer_state_steps`` = 0, read once
  at its first checked step by ``neuraldbg/monitor/measurements/optimizer_state.py``), at its
  peak rate from the first step (no warm-up: ``lr_first`` above ``WARMUP_START`` of the peak),
  and the loss was thrown at least ``RESUME_RISE``-fold over its first value, to at least
  ``RISE_LEVEL`` of its reference, on at least ``RESUME_SHARE`` of the steps within the first
  ``RESUME_WINDOW`` of the run. "none" otherwise: the state was restored, a warm-up eased the fresh optimizer
  in, or the loss did not answer (a fine-tune on a new task starts high and falls; a fresh
  optimizer that does no harm is no fault). Unobserved at initialization, where every
  optimizer starts empty.

Cut points (reasoning in ``docs/causal_model.md``):

* ``RESUME_RISE`` -- 5x the first loss: a checkpoint resumed without its state (a user's run)
  went from 6e-4 to 0.4; a healthy resume (state restored) or a fine-tune continues at or
  below its first loss, and the noise of a small batch is well under 2x at a loss floor that
  is not near zero.
* ``RESUME_WINDOW``/``RESUME_POINTS`` -- a tenth of the run (at least 10 steps), at least 5
  losses: a fresh Adam's full-size steps act in the first few updates; a rise later in the run
  is another story.
* ``RESUME_SHARE`` -- a third of those steps: a model thrown off its floor keeps being thrown
  (5 to 6 of the first 12 steps of the plain encoder resumed at 1e-2), a restored one shows at
  most a batch's confident mistake (1 of 12 for its twin).
"""
from __future__ import annotations

import math

from neuraldbg.causal.nodes.causes import scale_invariant
from neuraldbg.causal.nodes.run import LR_PEAK, OPTIMIZER, chance_loss, started_trained
from neuraldbg.causal.nodes.schedule import LR_FIRST, RISE_LEVEL, WARMUP_START, loss_reference
from neuraldbg.causal.structure import Reading, Table
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import OPTIMIZER as OPTIMIZER_EVENTS, Event
from neuraldbg.trace import Signature

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 46

RESUME_RISE = 5.0
RESUME_WINDOW = 0.1
RESUME_POINTS = 5
RESUME_SHARE = 1 / 3

OPTIMIZER_STATE_STEPS = Signature("optimizer_state_steps", "integer", "entry", "lead",
                                  "the primary optimizer's own step count at its first checked step (0: its "
                                  "state was empty, a fresh optimizer)", lo=0)

SIGNATURES = (OPTIMIZER_STATE_STEPS,)


def resume_rise(history: list[tuple[int, float]], first_step: int, last_step: int,
                reference: float | None) -> tuple[float, int, int] | None:
    """How far the loss was thrown right after the start: among the finite losses after the
    first within the first ``RESUME_WINDOW`` of the run (at least ``2 x RESUME_POINTS`` steps;
    at least ``RESUME_POINTS`` losses), those at least ``RESUME_RISE`` x the first loss and at
    least ``RISE_LEVEL`` of ``reference`` (unchecked without one) are *thrown*; when at least
    ``RESUME_SHARE`` of them are, ``(median thrown / first, thrown, losses)``, else ``None``.
    A share, not a median: a model thrown off its floor comes back to it between bad steps
    (a trained encoder under a fresh AdamW: 0.004, 0.25, 0.001, 0.36, 0.016, 0.5...), where a
    restored run has at most a batch's confident mistake. Pure."""
    vals = [(s, v) for s, v in history if math.isfinite(v)]
    if not vals or vals[0][0] != first_step or vals[0][1] <= 0:
        return None
    first = vals[0][1]
    horizon = first_step + max(2 * RESUME_POINTS, int(RESUME_WINDOW * (last_step - first_step)))
    after = [v for s, v in vals[1:] if s <= horizon]
    if len(after) < RESUME_POINTS:
        return None
    floor = max(RESUME_RISE * first, RISE_LEVEL * reference if reference is not None else 0.0)
    thrown = sorted(v for v in after if v >= floor)
    if len(thrown) < RESUME_SHARE * len(after):
        return None
    return thrown[len(thrown) // 2] / first, len(thrown), len(after)


def optimizer_restart(view: TraceView) -> Reading | None:
    """'shock' (trained weights, a fresh adaptive optimizer at its peak rate, a loss thrown off
    its level) or 'none'; unobserved at initialization."""
    sigs = view.signatures
    trained = started_trained(sigs)
    if not trained:
        return Reading(None, reason="the run started at initialization, where every optimizer starts empty")
    n = sigs.number(OPTIMIZER_STATE_STEPS)
    if n is None:
        return view.unmeasured(OPTIMIZER_STATE_STEPS, "the optimizer's state was not read")
    name = sigs.value(OPTIMIZER) or "the optimizer"
    if n > 0:
        return Reading("none", (), f"{name} resumed with its state ({int(n)} steps)")
    if not scale_invariant(sigs.value(OPTIMIZER)):
        return Reading(None, reason=f"{name} is not adaptive: an empty state says little of its steps")
    first, peak = sigs.number(LR_FIRST), sigs.number(LR_PEAK)
    if first is not None and peak is not None and peak > 0 and first <= WARMUP_START * peak:
        return Reading("none", (), f"a fresh {name} on trained weights, eased in by a warm-up")
    trace = view.trace
    got = resume_rise(list(trace.loss.history), trace.first_step, trace.last_step,
                      loss_reference(trace.loss.history, chance_loss(sigs)))
    if got is None:
        return Reading("none", (), f"a fresh {name} on trained weights; the loss kept its level")
    rise, thrown, n = got
    ev = Event(OPTIMIZER_EVENTS, "spike", None, trace.first_step, severity=rise, values={"loss_rise": rise})
    return Reading("shock", (ev,), (f"trained weights resumed under a fresh {name} (no state) at its peak rate: the "
                                    f"loss was thrown to {rise:.3g}x its first value on {thrown} of the next {n} "
                                    f"steps after step {trace.first_step}"))


NODES = (
    Table(
        "optimizer_restart", ("none", "shock"), parents=("data", "learning_rate"),
        rows=(
            ({"learning_rate": "too_high"}, (0.45, 0.55)),
            ({"data": "shifted"}, (0.90, 0.10)),
            ({}, (0.99, 0.01)),
        ),
        why="Observed only on a run that started on trained weights. 'shock': the optimizer's "
            "state was empty (a fresh Adam: no second moments, full-size first steps) at its peak "
            "rate, and the loss jumped RESUME_RISE-fold off the level the weights had reached: the "
            "effective step is too large for these weights, a checkpoint restored without its "
            "optimizer and scheduler state. A rate too high on trained weights shows this way in "
            "about half its runs (the other half carries its state or a warm-up and blows up "
            "later); new data at the resume can throw the loss up too, but starts high at the "
            "first step rather than rising after it. The leak covers a healthy resume whose "
            "first batches happen to be hard.",
        extract=optimizer_restart,
    ),
)
