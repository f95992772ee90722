"""``do(data = ok)``: model inputs repaired at the model's entry by a forward pre-hook.

Non-finite samples are zeroed (and updates with non-finite gradients skipped); inputs that
left their warm-up distribution are standardized back to it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from neuraldbg.verify.interventions import Context, Intervention, optimizer_hooks, register_intervention
from neuraldbg.verify.snapshots import floating_inputs

#: A batch is standardized only when it left the warm-up distribution: its std off by this
#: factor, or its mean off by this many warm-up stds (half the shift detector's defaults).
SHIFT_SCALE = 2.5
SHIFT_MEAN_Z = 1.5


def _replace_inputs(fn: Callable[[Any, torch.Tensor], torch.Tensor | None]) -> Callable:
    """A forward pre-hook applying ``fn(key, tensor)`` to every floating input (``None``: keep);
    eager under ``torch.compile`` (it reads values on the host)."""

    def hook(module: nn.Module, args: tuple, kwargs: dict):
        args, kwargs = list(args), dict(kwargs)
        changed = False
        for key, x in floating_inputs(tuple(args), kwargs):
            y = fn(key, x)
            if y is not None:
                changed = True
                if isinstance(key, int):
                    args[key] = y
                else:
                    kwargs[key] = y
        return (tuple(args), kwargs) if changed else None

    return torch.compiler.disable(hook)


@register_intervention("data", "corrupted")
class DropNonFinite(Intervention):
    """Samples with a NaN/Inf entry zeroed at the model input; an update whose gradients are
    not finite (a NaN/Inf target) skipped."""

    def describe(self) -> str:
        return "non-finite samples dropped (zeroed at the model input) and updates with non-finite gradients skipped"

    def untestable(self, ctx: Context) -> str | None:
        tr = ctx.trace
        nonfinite = tr.loss.n_nonfinite > 0 or any(e.kind in ("nan", "inf") for e in tr.events)
        return None if nonfinite else "no non-finite loss or value in the run: nothing to drop " \
            "(label faults cannot be repaired from outside the data pipeline)"

    def apply(self, ctx: Context) -> Callable[[], None]:
        def clean(key: Any, x: torch.Tensor) -> torch.Tensor | None:
            bad = ~torch.isfinite(x)
            if not bool(bad.any()):
                return None
            ctx.acted += 1
            rows = bad.reshape(x.shape[0], -1).any(1) if x.dim() > 1 else bad
            return torch.where(rows.reshape((-1,) + (1,) * (x.dim() - 1)), torch.zeros_like(x), x)

        ids = ctx.params()

        def pre(opt: Any) -> None:
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None and id(p) in ids]
            if params and not bool(torch.stack([torch.isfinite(p.grad).all() for p in params]).all()):
                for g in opt.param_groups:
                    for p in g["params"]:
                        p.grad = None  # an optimizer skips parameters without a gradient
                ctx.acted += 1

        h = ctx.model.register_forward_pre_hook(_replace_inputs(clean), with_kwargs=True)
        undo = optimizer_hooks(ctx, pre)
        return lambda: (h.remove(), undo())


@register_intervention("data", "shifted")
class Standardize(Intervention):
    """Each floating model input that left its warm-up distribution rescaled to the warm-up
    mean and std."""

    def describe(self) -> str:
        return "inputs off their warm-up distribution standardized to its mean and std"

    def untestable(self, ctx: Context) -> str | None:
        if not ctx.input_reference:
            return "no floating model input was seen during the warm-up (token ids, or a model " \
                "whose own forward is not called): nothing to standardize"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        ref = ctx.input_reference

        def standardize(key: Any, x: torch.Tensor) -> torch.Tensor | None:
            if key not in ref:
                return None
            m0, s0 = ref[key]
            xf = x.float()
            m, s = xf.mean(), xf.std()
            if not (bool(torch.isfinite(m)) and bool(torch.isfinite(s)) and float(s) > 0):
                return None
            # a batch within the warm-up distribution is left alone: rescaling every batch a
            # little would perturb a run whose trouble is elsewhere, and a chaotic run then
            # looks "better" by chance
            ratio, z = float(s) / s0, abs(float(m) - m0) / s0
            if 1 / SHIFT_SCALE <= ratio <= SHIFT_SCALE and z <= SHIFT_MEAN_Z:
                return None
            ctx.acted += 1
            return ((xf - m) / s * s0 + m0).to(x.dtype)

        h = ctx.model.register_forward_pre_hook(_replace_inputs(standardize), with_kwargs=True)
        return h.remove
