"""The primary optimizer's own state as the run found it: fresh, or resumed with its steps.

Read once: on entry when the monitor knows the optimizer then, else at the primary optimizer's
first checked step, before its update. An empty ``state`` is a fresh optimizer (0 steps); an
Adam-family state holds a ``step`` entry per parameter (a tensor on recent torch, on the host
unless the optimizer is ``capturable``/``fused``: then this one read is the only transfer, at
entry, never in the hot path). The ``optimizer_restart`` evidence
(``neuraldbg/causal/nodes/optimizer_state.py``) reads it on runs that start trained.
"""
from __future__ import annotations

from typing import Any

from neuraldbg.causal.nodes.optimizer_state import OPTIMIZER_STATE_STEPS
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement


def state_steps(optimizer: Any) -> int | None:
    """The optimizer's own step count from its per-parameter state: 0 for an empty state, the
    ``step`` entry of the first parameter state that has one, else ``None`` (state without a
    step count: momentum buffers only, or an optimizer-like object without ``state``)."""
    state = getattr(optimizer, "state", None)
    if state is None:
        return None
    try:
        entries = [s for s in state.values() if s]
    except Exception:  # noqa: BLE001 - an optimizer-like object with an odd state
        return None
    if not entries:
        return 0
    for s in entries:
        step = s.get("step") if hasattr(s, "get") else None
        if step is None:
            continue
        try:
            # one scalar, read once per run (a tensor on recent torch)
            return int(step.item() if hasattr(step, "item") else step)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


@register_measurement
class OptimizerState(Measurement):
    """``optimizer_state_steps``: the primary optimizer's step count as the run found it."""

    signatures = (OPTIMIZER_STATE_STEPS,)
    unchecked = ()  # read at most once, on entry or on a checked step

    def __init__(self) -> None:
        self._steps: int | None = None
        self._read = False
        self._at: int | None = None

    def enter(self, ctx: AddonContext) -> None:
        """Read the optimizer known on entry (given, or found then)."""
        if ctx.optimizer is not None:
            self._take(ctx, ctx.optimizer)

    def optimizer_pre(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """Read the primary optimizer before its first checked update, when entry could not."""
        if not self._read and checked and ctx.is_primary(optimizer):
            self._take(ctx, optimizer)

    def _take(self, ctx: AddonContext, optimizer: Any) -> None:
        self._read = True
        self._steps = state_steps(optimizer)
        self._at = ctx.step
        ctx.hook_done(self, "optimizer_pre")  # read once: nothing left to hear

    def summary(self) -> dict[Any, Any]:
        """``optimizer_state_steps`` once read (nothing for a state without a step count)."""
        return {OPTIMIZER_STATE_STEPS: self._steps} if self._steps is not None else {}

    def steps(self) -> dict[Any, int]:
        """Known from the step it was read at."""
        return {OPTIMIZER_STATE_STEPS: self._at} if self._steps is not None and self._at is not None else {}

    def gaps(self) -> dict[Any, str]:
        """Why the state was not read."""
        if self._steps is not None:
            return {}
        why = ("the optimizer's state holds no step count" if self._read
               else "no optimizer stepped the model's parameters on a checked step")
        return {OPTIMIZER_STATE_STEPS: why}
