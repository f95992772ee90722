"""The model input's hooks: the root's input on checked steps (and whether a training batch is
empty on every step), and the inputs of the root's direct children for a loop that calls its
sub-networks directly. A mixin of :class:`~neuraldbg.monitor.hooks.ModuleHooks`, which owns the
state they read (the step buffer, the root, the entry-hook switch; see its ``__init__``).

An input's statistics are 0-d tensors, a record per floating, dense, non-empty tensor
(:func:`neuraldbg.monitor.stats.input_stats`); an input with no elements records nothing.
"""
from __future__ import annotations

import torch

from neuraldbg.monitor import stats as S
from neuraldbg.monitor.gradhooks import GradientHooks
from neuraldbg.monitor.records import INPUT_SLOT, StepBuffer, tensors_of


def _input_records(slot: int, tensors) -> list[tuple]:
    """A ``(slot, element count, stats)`` record per floating, dense, non-empty tensor (no graph)."""
    return [(slot, t.numel(), S.input_stats(t)) for t in tensors
            if t.is_floating_point() and not t.is_sparse and t.numel() > 0]


class InputHooks(GradientHooks):
    """The input hooks of :class:`~neuraldbg.monitor.hooks.ModuleHooks` (module docstring)."""

    def _skip_forward(self, buf: StepBuffer) -> bool:
        # validation passes (no_grad, or eval() mode) must not mix into training statistics;
        # a model that is trained in eval() mode is noticed at its first backward
        # (GradientHooks._open_pass)
        if not buf.active or not torch.is_grad_enabled():
            return True
        if not self.root.training and not self.eval_trains:
            buf.eval_skipped = True
            return True
        return False

    def _on_entry(self, slot, module, args, kwargs):
        buf = self.buf
        if buf.root_called or self._skip_forward(buf):
            return None
        try:
            buf.entry.extend(_input_records(slot, tensors_of(args, kwargs)))
        except Exception as e:  # noqa: BLE001 - the monitor must not raise into training
            self._fail(("entry input", type(e).__name__), f"input statistics failed: {e!r}")
        return None

    def _on_input(self, module, args, kwargs):
        buf = self.buf
        buf.root_called = True
        if not buf.active:
            # an unchecked step (this hook stays in the model): only whether a training batch is
            # empty; for plain positional tensors read inline -- the general path below costs
            # several calls, on every step
            if not (torch.is_grad_enabled() and (self.root.training or self.eval_trains)):
                return None  # a validation pass
            if not kwargs:
                empty = bool(args)
                for a in args:
                    if type(a) is not torch.Tensor:
                        break  # containers, subclasses: the general path
                    empty = empty and a.numel() == 0
                else:
                    self.batch_empty = empty
                    return None
        else:  # the entry hooks would return at once for the rest of this step
            self.entries.set(False)
            self._in_root = True
        measure = not self._skip_forward(buf)
        if not measure and not (torch.is_grad_enabled() and (self.root.training or self.eval_trains)):
            return None  # a validation pass
        try:
            tensors = list(tensors_of(args, kwargs))
            # metadata only (no kernel), so also on unchecked steps: their loss must not count
            self.batch_empty = bool(tensors) and all(t.numel() == 0 for t in tensors)
            if measure:
                buf.records.extend(_input_records(INPUT_SLOT, tensors))
        except Exception as e:  # noqa: BLE001 - the monitor must not raise into training
            self._fail(("input", type(e).__name__), f"input statistics failed: {e!r}")
        return None
