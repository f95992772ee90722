"""The learning-rate schedule's start: whether the run warmed its rate up, where that matters.

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

Cut points (reasoning in ``docs/causal_model.md``):

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

from neuraldbg.causal.nodes.depth import postnorm_depth
from neuraldbg.causal.nodes.run import LR_PEAK, STARTED_TRAINED
from neuraldbg.causal.structure import Reading, Table
from neuraldbg.causal.view import TraceView
from neuraldbg.trace import Signature

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 45

WARMUP_START = 0.25
SCHEDULE_MIN_STEPS = 3
POSTNORM_DEEP = 6

LR_FIRST = Signature("lr_first", "number", "window", "lead",
                     "the learning rate of the first checked optimizer step (largest over param groups)", lo=0)
LR_WARMUP_STEPS = Signature("lr_warmup_steps", "integer", "window", "lead",
                            "steps from the first checked optimizer step to the first that reached the peak "
                            "learning rate (0: the rate started at its peak)", lo=0)
LR_LAST = Signature("lr_last", "number", "run", "lead",
                    "the learning rate of the last checked optimizer step (the schedule's decay)", lo=0)
LR_CHECKED = Signature("lr_checked", "integer", "run", "lead",
                       "checked optimizer steps whose learning rate was read", lo=0)

SIGNATURES = (LR_FIRST, LR_WARMUP_STEPS, LR_LAST, LR_CHECKED)


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
    if sigs.value(STARTED_TRAINED):
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
)
