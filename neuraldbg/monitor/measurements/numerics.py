"""The run's own numbers: the weights' dtype, and the first gradients and weights that left their range.

Three readings for the ``numerics`` evidence (``neuraldbg/causal/nodes/numerics.py``):

* ``weights_dtype`` -- on entry, the floating dtype that holds most trainable elements;
* ``nonfinite_grad_step`` -- from the host statistics of each checked step (no extra device
  work): the first step whose parameter gradients were non-finite, unless a ``GradScaler``
  was given (it skips such steps by design);
* ``nonfinite_weights_step`` -- after a checked optimizer update, one 2-norm per updated tensor
  accumulated in float32 (``torch._foreach_norm(dtype=float32)``: an fp16 norm of finite
  weights may exceed 65504; a float32 one overflows only past weights of about 1e19, which only a
  blow-up makes, and the birthplace reads an update after instability as that blow-up; Inf and
  NaN propagate), folded into one device flag; the step it is dated
  at is the one whose forward runs next on those weights, noted on the device with
  ``masked_fill_`` (no sync) and read once by :meth:`Numerics.summary`. The pass costs about a
  gradient norm (0.12 ms on a 0.5M-parameter MLP on one CPU thread, 3 % of its step), so it runs
  on every one of the first ``DENSE_UPDATES`` checked updates -- where an optimizer's own NaN is
  born: an ``eps`` that rounds to zero divides by zero at the first update -- and on every
  ``SPARSE_EVERY``-th after. A weight made non-finite by a later unchecked update is read as born
  in the forward that first ran on it (still the run's own numbers, never the data's).
"""
from __future__ import annotations

from typing import Any

import torch

from neuraldbg.causal.nodes.numerics import NONFINITE_GRAD_STEP, NONFINITE_WEIGHTS_STEP, WEIGHTS_DTYPE
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.stats import local, measurable


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def majority_dtype(params: Any) -> str | None:
    """The floating dtype holding most elements of the trainable ``params`` (``None``: none)."""
    counts: dict[torch.dtype, int] = {}
    for p in params:
        if p.requires_grad and p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + local(p).numel()
    if not counts:
        return None
    return dtype_name(max(counts.items(), key=lambda kv: (kv[1], str(kv[0])))[0])


#: checked updates whose weights are all checked, then one in ``SPARSE_EVERY``
DENSE_UPDATES = 64
SPARSE_EVERY = 4


def nonfinite_flag(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A 0-d bool tensor on the tensors' device: whether any element of ``tensors`` is NaN or
    infinite (one foreach norm kernel accumulated in float32, no host sync; the max-abs norm would
    need no wider dtype but has no fused CPU kernel and costs ten times more)."""
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    return torch.stack(norms).sum().isfinite().logical_not()


@register_measurement
class Numerics(Measurement):
    """``weights_dtype``, ``nonfinite_grad_step`` and ``nonfinite_weights_step`` (module docstring)."""

    signatures = (WEIGHTS_DTYPE, NONFINITE_GRAD_STEP, NONFINITE_WEIGHTS_STEP)
    unchecked = ()  # checked steps only: their statistics and their updates

    def __init__(self) -> None:
        self._dtype: str | None = None
        self._grad_step: int | None = None
        self._first: torch.Tensor | None = None  # device: the dated step, -1 while all finite
        self._weights_at: int | None = None      # host: that step, once read and found
        self._backward_at: int | None = None
        self._scaled = False
        self._updates = 0
        self._params: list[Any] = []             # _candidates
        self._params_key: tuple | None = None

    def enter(self, ctx: AddonContext) -> None:
        """The dtype census of the trainable parameters."""
        self._dtype = majority_dtype(p for p in ctx.root.parameters() if measurable(p))
        self._scaled = ctx.settings.scaler is not None

    def backward_started(self, ctx: AddonContext, param: Any) -> None:
        """The step a checked backward runs in: an update in that same step feeds the next
        step's forward; one made after ``record_loss`` advanced the step feeds this one's."""
        self._backward_at = ctx.step

    def checked_step(self, ctx: AddonContext, stats: Any) -> None:
        """The first step with non-finite parameter gradients (a GradScaler's skips excepted)."""
        if self._grad_step is None and not self._scaled and stats.grad_scale is None \
                and stats.nonfinite_grad_layers():
            self._grad_step = stats.step

    def optimizer_post(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """Whether a checked update left any updated tensor non-finite, dated on the device."""
        if not checked or not ctx.is_primary(optimizer):
            return
        self._updates += 1
        if self._updates > DENSE_UPDATES and self._updates % SPARSE_EVERY:
            return
        params = [local(p) for p in self._candidates(optimizer) if p.grad is not None]
        if not params:
            return
        date = ctx.step + 1 if self._backward_at is not None and self._backward_at >= ctx.step else ctx.step
        with torch.no_grad():  # the parameters require grad: no graph for their norms
            bad = nonfinite_flag(params)
            if self._first is None:
                self._first = torch.full((), -1, dtype=torch.int64, device=bad.device)
            self._first.masked_fill_(bad & (self._first < 0), date)

    def _candidates(self, optimizer: Any) -> list[Any]:
        """The optimizer's floating parameters the statistics can read, kept while its groups
        hold the same parameters (their identities are the key; a group added or a parameter
        swapped reads them again): checking every parameter's type cost more than their norm on a
        small model."""
        groups = optimizer.param_groups
        key = (id(optimizer), *(tuple(map(id, g["params"])) for g in groups))
        if self._params_key != key:
            self._params = [p for g in groups for p in g["params"] if measurable(p) and p.is_floating_point()]
            self._params_key = key
        return self._params

    def _weights_step(self) -> int | None:
        """The dated step of the first non-finite weights, read from the device flag (one host
        read; once found it never changes, so it is kept and never read again)."""
        if self._weights_at is None and self._first is not None:
            first = int(self._first.item())
            self._weights_at = first if first >= 0 else None
        return self._weights_at

    def summary(self) -> dict[Any, Any]:
        """The dtype, and the first non-finite gradient and weight steps where seen."""
        out: dict[Any, Any] = {} if self._dtype is None else {WEIGHTS_DTYPE: self._dtype}
        out.update(self.steps())  # a non-finite step is its own value
        return out

    def steps(self) -> dict[Any, int]:
        """The non-finite steps are known from their own step on."""
        out: dict[Any, int] = {}
        if self._grad_step is not None:
            out[NONFINITE_GRAD_STEP] = self._grad_step
        weights = self._weights_step()
        if weights is not None:
            out[NONFINITE_WEIGHTS_STEP] = weights
        return out

    def gaps(self) -> dict[Any, str]:
        """Why the dtype was not read."""
        return {} if self._dtype is not None else {WEIGHTS_DTYPE: "the model has no trainable floating parameter"}
