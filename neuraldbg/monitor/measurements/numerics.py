"""The run's own numbers: the weights' dtype, and the first gradients and weights that left their range.

Three readings for the ``numerics`` evidence (``neuraldbg/causal/nodes/numerics.py``):

* ``weights_dtype`` -- on entry, the floating dtype that holds most trainable elements;
* ``nonfinite_grad_step`` -- from the host statistics of each checked step (no extra device
  work): the first step whose parameter gradients were non-finite, unless a ``GradScaler``
  was given (it skips such steps by design);
* ``nonfinite_weights_step`` -- after a checked optimizer update, one 2-norm per updated tensor
  accumulated in float32 (:func:`~neuraldbg.monitor.stats.grad_norms`, float64 weights in their
  own precision: an fp16 norm of finite
  weights may exceed 65504; a float32 one overflows only past weights of about 1e19, which only a
  blow-up makes, and the birthplace reads an update after instability as that blow-up; Inf and
  NaN propagate); the step it is dated at is the one whose forward runs next on those weights.
  A check leaves only its norms on the device and its date on the host: every few checks the
  norms waiting are folded into one device number, the first check whose norms sum to a
  non-finite value (a few kernels for all of them, no sync), read once by
  :meth:`Numerics.summary`. The pass costs about a
  gradient norm (0.12 ms on a 0.5M-parameter MLP on one CPU thread, 3 % of its step), so it runs
  on every one of the first ``DENSE_UPDATES`` checked updates -- where an optimizer's own NaN is
  born: an ``eps`` that rounds to zero divides by zero at the first update -- and on every
  ``SPARSE_EVERY``-th after. A weight made non-finite by a later unchecked update is read as born
  in the forward that first ran on it (still the run's own numbers, never the data's).
"""
from __future__ import annotations

from array import array
from typing import Any

import torch

from neuraldbg.causal.nodes.numerics import NONFINITE_GRAD_STEP, NONFINITE_WEIGHTS_STEP, WEIGHTS_DTYPE
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.stats import grad_norms, is_sharded, local, measurable


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
#: norms held before the checks waiting are folded into the device flag: a fold costs a few
#: kernels whatever it holds, a check two (its foreach norm and their stack); the bound keeps the
#: memory and the objects held few
FOLD_NORMS = 256
#: the device flag before a non-finite check is found (above any check number)
_NONE = 2 ** 62


def first_nonfinite_row(rows: torch.Tensor, start: int, none: int = _NONE) -> torch.Tensor:
    """The number of the first row of ``rows`` (2-d: one check's norms per row, numbered from
    ``start``) whose sum is not finite, as a 0-d int64 tensor on their device; ``none`` when every
    sum is finite. No host sync. Pure."""
    at = torch.arange(start, start + rows.shape[0], device=rows.device)
    return torch.where(rows.sum(dim=1).isfinite(), none, at).min()


@register_measurement
class Numerics(Measurement):
    """``weights_dtype``, ``nonfinite_grad_step`` and ``nonfinite_weights_step`` (module docstring)."""

    signatures = (WEIGHTS_DTYPE, NONFINITE_GRAD_STEP, NONFINITE_WEIGHTS_STEP)
    unchecked = ()  # checked steps only: their statistics and their updates

    def __init__(self) -> None:
        self._dtype: str | None = None
        self._grad_step: int | None = None
        self._first: torch.Tensor | None = None  # device: the first non-finite check's number (_NONE: none)
        self._weights_at: int | None = None      # host: its date, once read and found
        self._dates = array("q")                 # host: every check's date, by check number
        self._waiting: list[torch.Tensor] = []  # device: the norms (1-d) of the checks not yet folded
        self._backward_at: int | None = None
        self._scaled = False
        self._updates = 0
        self._params: list[tuple[Any, bool]] = []  # _candidates
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
                and not stats.grads_finite():
            self._grad_step = stats.step

    def optimizer_post(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """Whether a checked update left any updated tensor non-finite, dated on the device."""
        if not checked or not ctx.is_primary(optimizer):
            return
        self._updates += 1
        if self._updates > DENSE_UPDATES and self._updates % SPARSE_EVERY:
            return
        cands = self._candidates(optimizer)
        params = [local(p) if sharded else p for p, sharded in cands if p.grad is not None]
        if not params:
            return
        date = ctx.step + 1 if self._backward_at is not None and self._backward_at >= ctx.step else ctx.step
        with torch.no_grad():  # the parameters require grad: no graph for their norms
            # 2-norms, accumulated in float32 where that does not narrow (float64 keeps its own):
            # NaN and Inf in any element propagate into them; judged at the next fold
            norms = grad_norms(params)
        if self._waiting and len(norms) != len(self._waiting[0]):
            self._fold()  # rows of one length fold together
        self._waiting.append(norms)
        self._dates.append(date)
        if len(self._waiting) * len(norms) >= FOLD_NORMS:  # the rows waiting have one length
            self._fold()

    def _fold(self) -> None:
        """The checks waiting, folded into the device number of the first non-finite one."""
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        k = len(waiting)
        with torch.no_grad():
            found = first_nonfinite_row(torch.stack(waiting), len(self._dates) - k)
            self._first = found if self._first is None else torch.minimum(self._first, found)

    def _candidates(self, optimizer: Any) -> list[tuple[Any, bool]]:
        """The optimizer's floating parameters the statistics can read, each with whether it is
        sharded (its local shard is read), kept while its groups hold the same parameters (their
        identities are the key; a group added or a parameter swapped reads them again): checking
        every parameter's type cost more than their norm on a small model."""
        groups = optimizer.param_groups
        key = (id(optimizer), *(tuple(map(id, g["params"])) for g in groups))
        if self._params_key != key:
            self._params = [(p, is_sharded(p)) for g in groups for p in g["params"]
                            if measurable(p) and p.is_floating_point()]
            self._params_key = key
        return self._params

    def _weights_step(self) -> int | None:
        """The dated step of the first non-finite weights, read from the device flag (one host
        read; once found it never changes, so it is kept and never read again)."""
        if self._weights_at is None:
            self._fold()
            if self._first is not None:
                first = int(self._first.item())
                self._weights_at = self._dates[first] if first < _NONE else None
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
