"""``do(training_loop = ok)``: the loop bugs repaired from outside the step function.

Stale gradients zeroed after every step, the parameters missing from the optimizer stepped by
a copy of it, and probability outputs handed to the loss as log-probabilities. A graph
detached inside the model's own forward cannot be repaired from outside it and has no
intervention.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from neuraldbg.causal.nodes.loop import PROB_SHARE, PROB_SHARE_SIG, STALE_STEPS
from neuraldbg.verify.interventions import Context, Intervention, optimizer_hooks, register_intervention


@register_intervention("training_loop", "stale_gradients")
class ZeroGradients(Intervention):
    """Gradients set to ``None`` after every step of an optimizer stepping the model, as
    ``zero_grad()`` would."""

    from_start = True

    def describe(self) -> str:
        return "gradients zeroed after every optimizer step"

    def untestable(self, ctx: Context) -> str | None:
        stale = ctx.trace.signatures.number(STALE_STEPS)
        if not stale:
            return "no examined optimizer step ran on stale gradients: nothing to zero"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        ids = ctx.params()

        def post(opt: Any) -> None:
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) in ids and p.grad is not None:
                        p.grad = None
            ctx.acted += 1

        # the replay starts from a snapshot: leftover gradients of the run go too
        for p in ctx.model.parameters():
            p.grad = None
        return optimizer_hooks(ctx, lambda opt: None, post)


def _missing(ctx: Context) -> list[torch.Tensor]:
    held = {id(p) for g in ctx.optimizer.param_groups for p in g["params"]} if ctx.optimizer is not None else set()
    seen: set[int] = set()
    out = []
    for p in ctx.model.parameters():
        if p.requires_grad and id(p) not in held and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


@register_intervention("training_loop", "params_not_in_optimizer")
class AddMissingParams(Intervention):
    """The trainable parameters no param group holds, stepped by a copy of the optimizer (same
    class and defaults, the first group's hyperparameters) right after each of its steps, and
    zeroed with it."""

    from_start = True

    def describe(self) -> str:
        return "the trainable parameters missing from the optimizer stepped by a copy of it"

    def untestable(self, ctx: Context) -> str | None:
        if ctx.optimizer is None or not hasattr(ctx.optimizer, "param_groups"):
            return "no torch optimizer to copy"
        if not _missing(ctx):
            return "every trainable parameter is in the optimizer's param groups"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        opt = ctx.optimizer
        group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
        missing = _missing(ctx)
        try:
            extra = type(opt)(missing, **group)
        except TypeError:  # an optimizer whose groups hold keys its constructor does not take
            extra = type(opt)(missing, **opt.defaults)
        ctx.notes["layers"] = sorted({n.rsplit(".", 1)[0] for n, p in ctx.model.named_parameters()
                                      if any(p is q for q in missing)})

        def post(o: Any) -> None:
            if o is not opt:
                return
            if any(p.grad is not None for p in missing):
                extra.step()
                ctx.acted += 1
            extra.zero_grad(set_to_none=True)

        handle = register_optimizer_step_post_hook(lambda o, a, k: post(o))
        return handle.remove


#: tolerance of the probability-row test (float rounding of a softmax)
ROW_TOL = 1e-3


def _log_if_probabilities(y: Any) -> Any:
    """``log(y)`` when ``y``'s last-dimension rows are probability vectors, else ``None``."""
    if not (isinstance(y, torch.Tensor) and y.is_floating_point() and y.dim() >= 1 and y.shape[-1] >= 2):
        return None
    with torch.no_grad():
        yd = y.detach().float()
        rows = bool(yd.amin() >= -ROW_TOL) and bool(yd.amax() <= 1 + ROW_TOL) and \
            bool((yd.sum(-1) - 1).abs().amax() <= ROW_TOL)
    # log-probabilities make a log-softmax loss compute the negative log-likelihood it meant to
    return y.clamp_min(torch.finfo(y.dtype).tiny).log() if rows else None


@register_intervention("training_loop", "loss_on_probabilities")
class LogProbabilities(Intervention):
    """The model's probability rows handed on as log-probabilities (a forward hook on the model):
    a cross-entropy over them is then the negative log-likelihood the loop meant."""

    from_start = True

    def describe(self) -> str:
        return "the model's probability output handed to the loss as log-probabilities"

    def untestable(self, ctx: Context) -> str | None:
        share = ctx.trace.signatures.number(PROB_SHARE_SIG)
        if share is None or share < PROB_SHARE:
            return "the model's output rows were not probability vectors: nothing to hand on as log-probabilities"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if isinstance(output, torch.Tensor):
                y = _log_if_probabilities(output)
                if y is not None:
                    ctx.acted += 1
                return y
            if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                y = _log_if_probabilities(output[0])
                if y is not None:
                    ctx.acted += 1
                    return (y,) + tuple(output[1:])
                return None
            logits = getattr(output, "logits", None)
            y = _log_if_probabilities(logits)
            if y is not None:
                ctx.acted += 1
                output.logits = y
                return output
            return None

        return ctx.model.register_forward_hook(torch.compiler.disable(hook)).remove
