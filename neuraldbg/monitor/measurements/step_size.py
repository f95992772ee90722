"""The step size the learning rate produced: update-to-weight ratios over the first checked steps.

The signature of the ``learning_rate`` root cause (``docs/causal_model.md``): on checked steps the
optimizer step pre-hook copies the weight matrices that have a gradient, the post-hook turns
``||w_after - w_before|| / ||w_before||`` into per-layer ratios and keeps their median and
maximum over layers on the device, with that step's learning rate. Only the first
:attr:`StepSize.WINDOW` measured steps are kept: the step size the learning rate sets shows from
the first updates on, and a fault that strikes later (a bad batch blowing the weights up) must
not read as a learning-rate signature. Pure functions of tensors first, then the measurement.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from neuraldbg.causal.nodes.causes import STEP_RATIO_MAX, STEP_RATIO_MEDIAN, STEP_RATIO_PEAK, STEP_RATIO_STEPS
from neuraldbg.causal.nodes.numerics import UPDATE_LOST_SHARE
from neuraldbg.causal.nodes.run import LR_PEAK
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.stats import local, measurable


def probed_weights(census: Iterable[tuple[str, Any, torch.Tensor, float]]) -> dict[int, str]:
    """``id(param) -> layer`` of the weight matrices the step size is measured on: those of the
    weight census (:func:`~neuraldbg.monitor.measurements.weights.weight_census`) that are not
    exactly zero (zero by design, like a LoRA ``B``: no scale for a ratio)."""
    return {id(p): name for name, _, p, n in census if n != 0}


def layer_ratios(before: list[torch.Tensor], after: list[torch.Tensor], layer_index: torch.Tensor,
                 n_layers: int) -> torch.Tensor:
    """Per-layer ``||after - before|| / ||before||`` (NaN for layers whose weights are zero).

    ``layer_index[i]`` is the layer of tensor ``i``; every norm is taken by foreach kernels and
    grouped with one ``index_add``, so the cost does not grow with Python work per tensor.
    """
    delta = torch._foreach_sub(after, before)
    dn = torch.stack(torch._foreach_norm(delta)).float()
    wn = torch.stack(torch._foreach_norm(before)).float()
    dsq = torch.zeros(n_layers, device=dn.device).index_add_(0, layer_index, dn * dn)
    wsq = torch.zeros(n_layers, device=dn.device).index_add_(0, layer_index, wn * wn)
    nan = torch.full_like(wsq, math.nan)
    return torch.where(wsq > 0, (dsq / torch.where(wsq > 0, wsq, torch.ones_like(wsq))).sqrt(), nan)


def lost_counts(before: list[torch.Tensor], after: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    """``(elements the update left unchanged although their gradient was non-zero, elements with
    a non-zero gradient)`` over the tensors, as a 2-element float tensor on their device (no
    sync): the updates that rounded away below the weights' resolution."""
    lost = torch.zeros((), dtype=torch.float64, device=after[0].device) if after else torch.zeros(())
    meant = torch.zeros_like(lost)
    for b, a, g in zip(before, after, grads):
        wanted = g.ne(0)
        meant += wanted.sum()
        lost += wanted.logical_and_(a.eq(b)).sum()
    return torch.stack((lost, meant))


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """An index tensor on ``device`` without a blocking copy (a pinned, asynchronous one on
    CUDA), so that the training loop never waits for the device."""
    t = torch.tensor(values)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


#: the step-ratio signatures, measured (and missing) together
_RATIOS = (STEP_RATIO_MEDIAN, STEP_RATIO_MAX, STEP_RATIO_PEAK, STEP_RATIO_STEPS)


@register_measurement
class StepSize(Measurement):
    """Update-to-weight ratios of the optimizer's first measured steps (see the module docstring).

    Only the weight matrices of the census are measured (:func:`probed_weights`): a bias or a
    weight that starts at zero has no scale to be relative to, and its first updates read as
    "infinitely large" whatever the learning rate. Unchecked steps copy nothing. Updates scale
    with the learning rate (SGD and Adam alike), so each ratio is divided by its step's learning
    rate and the result is read at the run's peak learning rate: a warm-up does not make a
    healthy run look slow. :meth:`summary` reads them with one host transfer.
    """

    signatures = (STEP_RATIO_MEDIAN, STEP_RATIO_MAX, STEP_RATIO_PEAK, STEP_RATIO_STEPS, LR_PEAK, UPDATE_LOST_SHARE)
    unchecked = ()  # checked optimizer steps only: the weights are copied before their update
    #: measured optimizer steps kept (memory and copies stay bounded on long runs)
    WINDOW = 16

    def __init__(self) -> None:
        self.owner: dict[int, str] = {}         # id(param) -> layer name, for the weight matrices measured
        self._before: list[torch.Tensor] | None = None
        self._params: list[torch.Tensor] = []
        self._index: torch.Tensor | None = None
        self._n_layers = 0
        self._values: list[torch.Tensor] = []   # per measured step: (median, max) over layers
        self._lost: list[torch.Tensor] = []     # per measured step: (elements lost, elements meant to move)
        self._lrs: list[float | None] = []       # the learning rate of each measured step
        self._at: list[int] = []                 # the step of each measured update
        self._lr_now: float | None = None
        self._step = 0
        self.lr_peak: float | None = None        # over every checked step, not only the window
        self.unsupported: list[str] = []         # type names of weight matrices left unmeasured

    @property
    def n_steps(self) -> int:
        """Optimizer steps measured so far."""
        return len(self._values)

    def enter(self, ctx: AddonContext) -> None:
        """The weight matrices to measure, from the census taken on entry, and the types of
        those left out of it as tensor subclasses (so that a gap names them)."""
        self.owner = probed_weights(ctx.census)
        self.unsupported = sorted({type(p.data).__name__ for p in ctx.root.parameters()
                                   if p.dim() >= 2 and not measurable(p)})

    @staticmethod
    def _read_lr(optimizer: Any) -> float | None:
        # a tensor learning rate is skipped: reading it would sync
        lrs = [float(g["lr"]) for g in optimizer.param_groups if isinstance(g.get("lr"), (int, float))]
        return max(lrs) if lrs else None

    def optimizer_pre(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """Copy the measured weights before a checked step's update (the primary optimizer's:
        the one given, or every one found when none was given)."""
        if not ctx.is_primary(optimizer):
            return
        self._before = None
        if not checked or not self.owner:
            return
        lr = self._lr_now = self._read_lr(optimizer)
        if lr is not None:
            self.lr_peak = lr if self.lr_peak is None else max(self.lr_peak, lr)
        if len(self._values) >= self.WINDOW or lr == 0.0:
            return  # a zero learning rate (the first step of a warm-up) moves nothing to measure
        params = [p for g in optimizer.param_groups for p in g["params"]
                  if p.grad is not None and id(p) in self.owner]
        if not params:
            return
        if [id(p) for p in params] != [id(p) for p in self._params]:
            names = sorted({self.owner[id(p)] for p in params})
            pos = {n: i for i, n in enumerate(names)}
            self._params, self._n_layers = params, len(names)
            self._index = _to_device([pos[self.owner[id(p)]] for p in params], local(params[0]).device)
        with torch.no_grad():
            # a sharded weight (FSDP2) is copied and compared on this rank's shard: the ratio
            # ||dw|| / ||w|| of a shard stands for the whole matrix's (an intensive quantity of
            # many entries updated by one rule), so no collective is needed; the ranks' values
            # are merged by the signature's rule (the median) at exit
            self._before = torch._foreach_mul([local(p).detach() for p in params], 1.0)
        self._step = ctx.step

    def optimizer_post(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """Per-layer ratios of the update just made, reduced on the device."""
        if not ctx.is_primary(optimizer):
            return
        before, self._before = self._before, None
        if before is None:
            return
        with torch.no_grad():
            after = [local(p).detach() for p in self._params]
            ratios = layer_ratios(before, after, self._index, self._n_layers)
            grads = [local(p.grad).detach() if p.grad is not None else None for p in self._params]
            if all(g is not None and g.shape == a.shape for g, a in zip(grads, after)):
                self._lost.append(lost_counts(before, after, grads))
            # NaN-aware on the device: a layer with zero weights has no ratio, and masking it
            # out with boolean indexing would sync
            top = torch.nan_to_num(ratios, nan=-1.0).max()
            self._values.append(torch.stack((torch.nanmedian(ratios), top)))
        self._lrs.append(self._lr_now)
        self._at.append(self._step)

    def summary(self) -> dict[Any, Any]:
        """``step_ratio_median`` (per-step median over layers) and ``step_ratio_max`` (the fastest
        layer), each the median over the window of ``ratio / lr`` read at the peak learning rate
        (the plain median of ratios when the learning rate is unknown); ``step_ratio_peak``, the
        largest per-step median over the window, read the same way; ``step_ratio_steps`` and
        ``lr_peak``. One host transfer."""
        out: dict[Any, Any] = {}
        if self.lr_peak is not None:
            out[LR_PEAK] = self.lr_peak
        if not self._values:
            return out
        rows = torch.stack(self._values).cpu().tolist()
        out[STEP_RATIO_STEPS] = len(rows)
        if self._lost:
            shares = sorted(lost / meant for lost, meant in torch.stack(self._lost).cpu().tolist() if meant > 0)
            if shares:
                out[UPDATE_LOST_SHARE] = shares[len(shares) // 2]
        known = self.lr_peak is not None and all(lr is not None and lr > 0 for lr in self._lrs)
        for col, sig in ((0, STEP_RATIO_MEDIAN), (1, STEP_RATIO_MAX)):
            vals = [(r[col] / lr * self.lr_peak if known else r[col]) for r, lr in zip(rows, self._lrs)
                    if math.isfinite(r[col]) and r[col] >= 0]
            if vals:
                vals.sort()
                out[sig] = vals[len(vals) // 2]
                if sig is STEP_RATIO_MEDIAN:
                    # the first updates, before weights that a rate far too high blew up shrink the
                    # later ratios back (see causes.STEP_EXTREME)
                    out[STEP_RATIO_PEAK] = vals[-1]
        return out

    def gaps(self) -> dict[Any, str]:
        """Why nothing was measured: no optimizer stepped the model, or no weight matrix to measure."""
        if self._values:
            return {}
        if self.owner:
            why = "no optimizer stepped the model's parameters on a checked step"
        elif self.unsupported:  # weight matrices there, but of a type the statistics do not read
            why = (f"the model's weight matrices are {', '.join(self.unsupported)} tensors, a type the monitor "
                   "does not measure")
        else:
            why = "the model has no weight matrix to measure the step size on"
        return {sig: why for sig in _RATIOS}

    def steps(self) -> dict[Any, int]:
        """The window's values are known from its last measured step on (a timeline cut before
        it does not see them)."""
        if not self._at:
            return {}
        return {sig: self._at[-1] for sig in (*_RATIOS, UPDATE_LOST_SHARE)}
