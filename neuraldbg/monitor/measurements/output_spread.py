"""The model output's spread across the batch, at the start and at the end of the run.

The signature of a run that learned only a constant (``neuraldbg/causal/nodes/output.py``). On
checked steps a forward hook on the model reduces its output -- the prediction among its outputs,
as :func:`~neuraldbg.monitor.measurements.losskind.output_tensor` picks it -- on the device to two
numbers: the standard deviation across the batch (dimension 0), averaged over the output's other
entries, and the RMS. The first :data:`OUTPUT_WINDOW` measured steps are kept and a rolling window
of the last ones (read at most once every :data:`READ_GAP` steps); the host reads them once per
query, with one transfer. A small output is copied in the hook and reduced when the monitor's
transfer reads its steps (:meth:`OutputSpread.checked_step`), with the same kernels on the same
values: a dozen tiny kernels right after the forward cost several times what they cost there. Only a forward that
builds a graph counts (an evaluation under ``no_grad`` is not the training output), and the
first such forward of a step (micro-batches of one step share its weights). Pure functions of
tensors first, then the measurement.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Any

import torch

from neuraldbg.causal.nodes.output import OUTPUT_CV, OUTPUT_SPREAD_DROP, OUTPUT_WINDOW
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.measurements.losskind import output_tensor

#: after the first window, steps between two reads at least: a collapse is a steady state, and at
#: every=1 a read on each step would add its few kernels to every step of a small model
READ_GAP = 4
#: output entries per sample read at most (an LM's logits hold sequence x vocabulary of them): a
#: strided subset keeps a checked step's cost flat, and a constant output is constant in any subset
MAX_COLUMNS = 4096


#: readings of at most this many entries are copied in the hook and reduced later (a larger one,
#: an LM's logits, is reduced at once: its copies would hold memory)
DEFER_ENTRIES = 1 << 16
#: readings waiting to be reduced at most (bounds what the copies hold between transfers)
MAX_WAITING = 16


def spread_columns(y: torch.Tensor) -> torch.Tensor:
    """The ``(batch, entries)`` float32 view of ``y`` that :func:`spread_of` reduces (a strided
    subset of at most :data:`MAX_COLUMNS` entries per sample). Pure."""
    f = y.detach().reshape(y.shape[0], -1)
    if f.shape[1] > MAX_COLUMNS:
        f = f[:, ::-(-f.shape[1] // MAX_COLUMNS)]
    return f.float()


def spread_and_rms(y: torch.Tensor) -> torch.Tensor:
    """``[std across dim 0 (mean over the other entries), RMS]`` of ``y`` as a float32 tensor of
    two, on the device. Pure."""
    return spread_of(spread_columns(y))


def spread_of(f: torch.Tensor) -> torch.Tensor:
    """:func:`spread_and_rms` of the columns ``f`` (:func:`spread_columns`). Pure."""
    # two passes by hand: torch.var_mean over dim 0 runs a per-column Welford loop on the CPU,
    # 40x slower on an (8, 4000) output than a mean and a mean of squares
    mean = f.mean(dim=0)
    d = f - mean
    var = (d * d).mean(dim=0)
    return torch.stack((var.sqrt().mean(), (var + mean * mean).mean().sqrt()))


def spread_summary(first: list[tuple[float, float]], last: list[tuple[float, float]]) -> tuple[float, float] | None:
    """``(cv, drop)`` from the two windows of ``(spread, rms)``: the last window's median spread
    over its median RMS, and over the first window's median spread; ``None`` when a value is not
    finite or the output is exactly zero. Pure."""
    vals = [v for pair in first + last for v in pair]
    if not first or not last or any(v != v or v in (float("inf"), float("-inf")) for v in vals):
        return None
    s0 = statistics.median(s for s, _ in first)
    s1, r1 = statistics.median(s for s, _ in last), statistics.median(r for _, r in last)
    if r1 <= 0:
        return None
    if s0 > 0:
        return s1 / r1, s1 / s0
    # an output constant at the start: constant still is no change (no collapse learned), varying
    # now is growth from nothing (a large, finite ratio: sessions store it as JSON)
    return s1 / r1, (1.0 if s1 == 0 else 1e6)


@register_measurement
class OutputSpread(Measurement):
    """The output's spread across the batch on checked steps (see the module docstring)."""

    signatures = (OUTPUT_CV, OUTPUT_SPREAD_DROP)
    unchecked = ()  # its hook is out of the model on unchecked steps

    def __init__(self) -> None:
        self._ctx: AddonContext | None = None
        self._handle: Any = None
        self._first: list[torch.Tensor] = []
        self._last: deque[torch.Tensor] = deque(maxlen=OUTPUT_WINDOW)
        self._seen_step: int | None = None
        self._last_step: int | None = None
        self._compiled = False
        self._single = False  # a training output with a batch of one was seen
        self._read: tuple[int, tuple[float, float] | None] | None = None  # (measured count, result)
        self._count = 0
        self._waiting: list[torch.Tensor] = []  # copied readings, reduced by _reduce_waiting

    def enter(self, ctx: AddonContext) -> None:
        """Hook the model's output on checked steps."""
        self._ctx = ctx
        self._handle = ctx.root.register_forward_hook(self._on_output)
        ctx.checked_only(self._handle, self._on_output)

    def _on_output(self, module: Any, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            self._compiled = True  # a reduction in the hook would break the compiled graph
            return None
        ctx = self._ctx
        if ctx is None or not ctx.measuring() or ctx.step == self._seen_step:
            return None
        if self._count >= OUTPUT_WINDOW and ctx.step - (self._last_step or 0) < READ_GAP:
            return None
        y = output_tensor(output, getattr(output, "loss", None) if not isinstance(output, torch.Tensor) else None)
        if not isinstance(y, torch.Tensor) or not y.is_floating_point() or not y.requires_grad or y.dim() < 1:
            return None
        if y.shape[0] < 2:
            self._single = True  # a batch of one: no spread across it
            return None
        self._seen_step = ctx.step
        f = spread_columns(y)  # of y.detach(): no graph, no grad-mode switch needed
        if f.is_contiguous() and f.numel() <= DEFER_ENTRIES:
            # a copy of the same layout, reduced by the same kernels later: the same values
            self._waiting.append(f.clone())
            if len(self._waiting) >= MAX_WAITING:
                self._reduce_waiting()
        else:
            self._reduce_waiting()  # the readings keep their order
            self._keep(spread_of(f))
        self._count += 1
        self._last_step = ctx.step
        return None

    def _keep(self, v: torch.Tensor) -> None:
        if len(self._first) < OUTPUT_WINDOW:
            self._first.append(v)
        else:
            self._last.append(v)

    def _reduce_waiting(self) -> None:
        """The copied readings, reduced in the order they were taken."""
        waiting, self._waiting = self._waiting, []
        for f in waiting:
            self._keep(spread_of(f))

    def checked_step(self, ctx: AddonContext, stats: Any) -> None:
        """The transfer read a checked step: the readings copied since the last one are reduced
        now, with the monitor's other host work."""
        if self._waiting:
            self._reduce_waiting()

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Remove the output hook."""
        if self._handle is not None:
            ctx.release(self._handle)
            self._handle = None

    def _values(self) -> tuple[float, float] | None:
        self._reduce_waiting()
        if len(self._last) < OUTPUT_WINDOW:
            return None
        if self._read is None or self._read[0] != self._count:
            vals = torch.stack(self._first + list(self._last)).tolist()  # one transfer per query
            k = len(self._first)
            self._read = (self._count, spread_summary([tuple(v) for v in vals[:k]], [tuple(v) for v in vals[k:]]))
        return self._read[1]

    def summary(self) -> dict[Any, Any]:
        """``output_cv`` and ``output_spread_drop`` once both windows are full."""
        got = self._values()
        return {} if got is None else {OUTPUT_CV: got[0], OUTPUT_SPREAD_DROP: got[1]}

    def steps(self) -> dict[Any, int]:
        """Both are as of the last measured step."""
        return {} if self._last_step is None or self._values() is None else \
            {OUTPUT_CV: self._last_step, OUTPUT_SPREAD_DROP: self._last_step}

    def gaps(self) -> dict[Any, str]:
        """Why no spread: compiled, too few checked steps, or non-finite outputs."""
        self._reduce_waiting()
        if self._compiled and not self._first:
            why = "the model is compiled: its output is not read inside the compiled graph"
        elif self._single and not self._first:
            why = "the model's output has a batch of one: no spread across the batch to read"
        elif len(self._last) < OUTPUT_WINDOW:
            why = (f"the model's training output was seen on {self._count} checked steps, fewer than "
                   f"{2 * OUTPUT_WINDOW}")
        elif self._values() is None:
            why = "the model's output was not finite, or exactly zero"
        else:
            return {}
        return {OUTPUT_CV: why, OUTPUT_SPREAD_DROP: why}
