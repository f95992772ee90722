"""``do(architecture = ok)``: the gradient norm clipped before every update.

Only the failures a clip can undo (:data:`CLIPPABLE`) are testable: normalization is not
inserted into the model.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from neuraldbg.verify.interventions import Context, Intervention, optimizer_hooks, register_intervention

#: Gradient-norm bound of ``do(architecture = ok)`` (the usual ``clip_grad_norm_`` default).
CLIP_NORM = 1.0
#: Failure types a gradient clip can undo; others (vanishing, saturation, dead units) cannot.
CLIPPABLE = ("exploding_gradients", "optimizer_instability")


@register_intervention("architecture", "unstable")
class ClipGradients(Intervention):
    """Gradient norm clipped to 1 before every update; untestable for vanishing, saturating or
    dead-unit failures (a clip cannot undo them, and normalization is not inserted)."""

    def describe(self) -> str:
        return f"gradient norm clipped to {CLIP_NORM:g} before every update"

    def untestable(self, ctx: Context) -> str | None:
        ft = getattr(ctx.hypothesis, "failure_type", None)
        if ft not in CLIPPABLE:
            return f"a {str(ft).replace('_', ' ')} failure is not one a gradient clip can undo, " \
                "and normalization is not inserted into the model"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        ids = ctx.params()

        def pre(opt: Any) -> None:
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None and id(p) in ids]
            if params:
                torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
                ctx.acted += 1

        return optimizer_hooks(ctx, pre)
