"""``do(learning_rate = ok)``: the rate scaled for each optimizer step, by :data:`LR_FACTOR`.

The hooks scale the rate a scheduler or the step function has just set, for that step only,
so the schedule goes on from its own values.
"""
from __future__ import annotations

from typing import Any, Callable

from neuraldbg.verify.interventions import Context, Intervention, optimizer_hooks, register_intervention
from neuraldbg.verify.outcome import VANISHED_IMPROVEMENT, late_steps, relative_gain

#: Learning-rate factor of ``do(learning_rate = ok)`` for each abnormal state.
LR_FACTOR = {"too_high": 0.1, "too_low": 10.0}


class _ScaleLR(Intervention):
    def describe(self) -> str:
        f = LR_FACTOR[self.state]
        return f"learning rate {'/' + format(1 / f, 'g') if f < 1 else 'x' + format(f, 'g')} in every param group"

    def apply(self, ctx: Context) -> Callable[[], None]:
        f = LR_FACTOR[self.state]
        saved: dict[int, list] = {}

        def pre(opt: Any) -> None:
            saved[id(opt)] = [g["lr"] for g in opt.param_groups]
            for g in opt.param_groups:
                g["lr"] = g["lr"] * f
            ctx.acted += 1

        def post(opt: Any) -> None:  # the schedule goes on from its own value
            for g, lr in zip(opt.param_groups, saved.pop(id(opt), ())):
                g["lr"] = lr

        return optimizer_hooks(ctx, pre, post)


@register_intervention("learning_rate", "too_high")
class LowerLR(_ScaleLR):
    """Learning rate /10 from the last snapshot before the onset."""


@register_intervention("learning_rate", "too_low")
class RaiseLR(_ScaleLR):
    """Learning rate x10 from the last snapshot before the onset; untestable while the loss
    is still falling fast (a larger step then speeds up any run, stuck or not)."""

    def untestable(self, ctx: Context) -> str | None:
        start, end, onset = ctx.window
        first = next((ctx.original[t] for t in range(start, end) if t in ctx.original), None)
        late = [ctx.original[t] for t in late_steps(start, end, onset) if t in ctx.original]
        if first is None or not late:
            return None
        progress = relative_gain(first, sum(late) / len(late))
        if progress > VANISHED_IMPROVEMENT:
            return (f"the loss fell {progress:.0%} over the window: not the plateau a too-low learning "
                    "rate leaves")
        return None
