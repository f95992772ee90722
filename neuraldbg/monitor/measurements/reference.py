"""A reference loss the run must keep: the pre-trained task of a fine-tune, measured as it goes.

A fine-tune that learns its new task as well as a healthy one can still overwrite what the
model knew: nothing in the training loss shows it. ``NeuralDbg(model, reference=fn)`` gives
the monitor a function ``fn(model) -> loss`` on a fixed held-out batch of the task the model
must keep (its pre-training task, say); :class:`ReferenceLoss` calls it on entry and at the
start of every ``reference_every``-th step, and the retention node
(``neuraldbg/causal/nodes/causes.py``) reads how much of the pre-trained margin to chance the
run gave up. :func:`neuraldbg.verify.api.verify` calls it again in its
replays, at the same steps, so an intervention is judged by what it did to the reference too.

The call never changes training: it runs under ``torch.no_grad()`` with every module in
``eval()`` mode (the monitor's hooks skip such passes, dropout draws nothing, batch norm
keeps its running statistics), the train/eval flags are put back afterwards, and the torch
RNG (CPU, and the model's CUDA device) is forked around it. A 0-d tensor result stays on
its device until ``sync_every`` results wait (one host transfer for all of them). A
function that raises is reported once and not called again: the run goes on unmonitored
for retention.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from neuraldbg.causal.nodes.causes import REFERENCE_FIRST, REFERENCE_N, REFERENCE_NONFINITE, REFERENCE_TAIL
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.history import LossHistory
from neuraldbg.monitor.lossinput import loss_value
from neuraldbg.monitor.measurements import register_measurement

#: ``reference_every`` when not given: a held-out forward every 10 steps
DEFAULT_EVERY = 10


def check_reference(reference: Any, every: Any) -> tuple[Callable | None, int]:
    """``(reference, every)`` validated: a callable ``fn(model) -> loss`` (or ``None``) and an
    int >= 1; ``TypeError``/``ValueError`` naming what is valid otherwise."""
    if reference is not None and not callable(reference):
        raise TypeError(f"reference must be a callable fn(model) -> loss on a held-out batch of the task the "
                        f"model must keep, or None; got {type(reference).__name__}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"reference_every must be an int >= 1, got {every!r}")
    return reference, every


def _devices(model: torch.nn.Module) -> list[int]:
    """CUDA device indices of the model's parameters (whose RNG a forward could draw from)."""
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


def evaluate(fn: Callable, model: torch.nn.Module) -> float | torch.Tensor:
    """``fn(model)`` as a float or detached 0-d tensor, with no trace left on training: no
    autograd, every module in eval mode and its flag restored, the RNG forked."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        with torch.random.fork_rng(devices=_devices(model)), torch.no_grad():
            model.eval()
            out = fn(model)
        try:
            return loss_value(out)
        except (TypeError, ValueError) as e:
            raise TypeError(f"reference(model) must return a loss, a real scalar ({e})") from None
    finally:
        for m, mode in modes:
            m.training = mode


@register_measurement
class ReferenceLoss(Measurement):
    """The reference loss of one monitor: recorded on entry and every ``every`` steps."""

    signatures = (REFERENCE_FIRST, REFERENCE_TAIL, REFERENCE_N, REFERENCE_NONFINITE)

    def __init__(self, fn: Callable, every: int = DEFAULT_EVERY) -> None:
        self.fn = fn
        self.every = every
        self.history = LossHistory()
        self._pending: list[tuple[int, Any]] = []
        # the value measured on entry, until a step says which one it belongs to
        self._entry: tuple[int, Any] | None = None
        self._broken = False

    @classmethod
    def for_monitor(cls, root: Any, settings: Any) -> "ReferenceLoss | None":
        """Only with ``NeuralDbg(reference=fn)``."""
        return cls(settings.reference, settings.reference_every) if settings.reference is not None else None

    def _measure(self, ctx: AddonContext) -> Any:
        if self._broken:
            return None
        try:
            return evaluate(self.fn, ctx.root)
        except Exception as e:  # noqa: BLE001 - a failing reference must not stop training
            self._broken = True
            ctx.report(("reference",), f"the reference function raised {e!r}; retention is not measured")
            return None

    def _push(self, ctx: AddonContext, step: int, value: Any) -> None:
        if value is None:
            return
        self._pending.append((step, value))
        if len(self._pending) >= ctx.sync_every:
            self.flush(ctx)

    def _claim_entry(self, ctx: AddonContext, step: int) -> None:
        """File the value measured on entry under ``step`` (once)."""
        if self._entry is not None:
            self._entry, (_, value) = None, self._entry
            self._push(ctx, step, value)

    def enter(self, ctx: AddonContext) -> None:
        """The model as training finds it."""
        self._entry = (ctx.step, self._measure(ctx))

    def step_started(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """A reference point on every ``every``-th step, before its forward."""
        if self._entry is not None:
            # no step closed since entry: the entry value *is* this step's model (a loop that
            # starts at a step other than 0, or a replay from a snapshot)
            self._claim_entry(ctx, step)
        elif step % self.every == 0:
            self._push(ctx, step, self._measure(ctx))

    def step_closed(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """The entry value belongs to the step that just closed."""
        self._claim_entry(ctx, step)

    def flush(self, ctx: AddonContext | None = None) -> None:
        """Move the waiting values to the host (one transfer)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        tensors = [v for _, v in pending if isinstance(v, torch.Tensor)]
        dev = tensors[0].device if tensors else None
        host = iter(torch.stack([t.float().to(dev) for t in tensors]).cpu().tolist()) if tensors else iter(())
        for step, v in pending:
            self.history.add(step, next(host) if isinstance(v, torch.Tensor) else float(v))

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Read what is left (an entry value no step claimed belongs to the step on entry)."""
        if self._entry is not None:
            self._claim_entry(ctx, self._entry[0])
        self.flush(ctx)

    def points(self) -> list[tuple[int, float]]:
        """``(step, reference loss)`` recorded so far (downsampled on long runs)."""
        self.flush()
        return list(self.history.points)

    def summary(self) -> dict[Any, Any]:
        """``reference_first`` (the model as training found it), ``reference_tail`` (median of
        the last quarter of the recorded values, at least one; left out when one of them is
        not finite), ``reference_n`` and ``reference_nonfinite``; nothing before two values."""
        pts = self.points()
        if len(pts) < 2:
            return {}
        vals = [v for _, v in pts]
        out: dict[Any, Any] = {REFERENCE_N: self.history.n, REFERENCE_NONFINITE: self.history.n_nonfinite}
        if math.isfinite(vals[0]):
            out[REFERENCE_FIRST] = vals[0]
        tail = sorted(vals[len(vals) - max(1, len(vals) // 4):])
        if all(math.isfinite(v) for v in tail):
            out[REFERENCE_TAIL] = tail[len(tail) // 2]
        return out

