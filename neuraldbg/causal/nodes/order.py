"""Which came first when a run both blew up and lost its loss: the gradients or the loss.

``order`` is observed only when both exploding gradients and loss instability (a spike, a
divergence or a non-finite loss) occurred: updates that are too large grow the gradients
before the loss blows up; a bad batch hits loss and gradients at the same step. Neither counts
where its own node found it no evidence: exploding gradients only on a confident model's
mistaken batches (``exploding``), spikes that were such batches (``loss_pattern``).
"""
from __future__ import annotations

from neuraldbg.causal.nodes.layers import exploding
from neuraldbg.causal.nodes.floor import spikes_were_mistakes
from neuraldbg.causal.structure import Reading, Table
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import GRADIENT, OPTIMIZER

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py): after the loss's
ORDER = 31


def order(view: TraceView) -> Reading | None:
    """Which came first, exploding gradients or loss instability (observed when both occurred)."""
    events, trace = view.events, view.trace
    expl = view.of_kind(GRADIENT, "exploding")
    if expl and exploding(view).state is None:
        return Reading(None, reason="the exploding gradients are no evidence (exploding says why)")
    # spikes that were one batch's confident mistakes are no instability (loss_pattern says why)
    kinds = ("divergence",) if spikes_were_mistakes(view) else ("spike", "divergence")
    unstable_loss = [e for e in events if e.type == OPTIMIZER and e.kind in kinds]
    loss_step = min([e.step for e in unstable_loss], default=None)
    if trace.loss.first_nonfinite_step is not None:
        loss_step = min(loss_step, trace.loss.first_nonfinite_step) if loss_step is not None \
            else trace.loss.first_nonfinite_step
    if not expl or loss_step is None:
        return Reading(None, reason="needs both exploding gradients and an unstable loss")
    g = min(e.step for e in expl)
    state = "grad_first" if g < loss_step else ("same_step" if g == loss_step else "loss_first")
    support = (view.first(expl),) + tuple(e for e in unstable_loss if e.step == loss_step)
    return Reading(state, support, f"exploding gradients at step {g}, loss instability at step {loss_step}")


NODES = (
    Table(
        "order", ("grad_first", "same_step", "loss_first"), parents=("data", "instability"),
        rows=(
            ({"data": "corrupted"}, (0.15, 0.60, 0.25)),
            ({"data": "shifted"}, (0.20, 0.55, 0.25)),
            ({"instability": "training"}, (0.60, 0.30, 0.10)),
            ({"instability": "init"}, (0.35, 0.55, 0.10)),
            ({}, (1 / 3, 1 / 3, 1 / 3)),
        ),
        why="Which came first when both a gradient event and loss instability occurred "
            "(unobserved otherwise): updates that are too large grow the gradients before the "
            "loss blows up; a bad batch hits loss and gradients at the same step.",
        extract=order,
    ),
)
