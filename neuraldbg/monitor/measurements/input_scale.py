"""The input's absolute scale at the entry layer: per-feature RMS against the scale init assumes.

The signature of ``data=shifted`` *at the input* that the shift detectors cannot give: they
compare each batch with the run's own warm-up, so inputs that are off-scale from the first step
on (raw 0-255 pixels, unscaled tabular columns) look like "no shift". A standard initialization
(PyTorch's default, Xavier, Kaiming, the transformer libraries' std 0.02) assumes inputs of
about unit scale per feature; here the input of each *entry layer* is measured against that.

An entry layer is a module that reads a tensor the model was called with (the root's or its
direct children's inputs), found by storage identity on the first measured forward: a view
(``flatten``, ``view``) of an input counts, a computed tensor does not. Only an entry layer
that owns a weight matrix (Linear, Conv, RNN; it takes the raw scale into its output) is
measured; a normalization layer as entry makes the raw scale irrelevant (noted, not measured),
and token ids are not floats. On checked steps its input's per-feature RMS (features: the
last dimension, channels for a convolution) is reduced on the device and kept as a running
elementwise maximum, also on the device (and the first measured step's apart: off-scale from
the start, a warm-up comparison cannot see it); :meth:`InputScale.summary` reads it with one host
transfer. Once the entry layers are known the hooks on the other candidates are removed.

The input's scale is a property of the data, not of one step: it is read on the first
:data:`FIRST_CHECKS` checked steps (off-scale from the start shows there) and then on every
:data:`EVERY_CHECK`-th one, so a feature that goes off-scale mid-run is seen within that many
checks, and the per-feature reductions (a pass over the input each) are not paid on every
check. Pure functions of tensors first, then the measurement.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from torch import nn

from neuraldbg.causal.nodes.data import (INPUT_ABS_MAX, INPUT_FEATURES, INPUT_NORMALIZED_AT, INPUT_OFF_SCALE,
                                         INPUT_RMS_FIRST, INPUT_RMS_LARGE, INPUT_RMS_MAX)
from neuraldbg.causal.nodes.depth import NORM_TYPES
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.records import tensors_of

#: offending features named in ``input_off_scale`` (the largest first)
NAMED_FEATURES = 5
#: checked steps read one after the other from the start, then one check in EVERY_CHECK
FIRST_CHECKS = 16
EVERY_CHECK = 8


def check_due(checks_done: int) -> bool:
    """Whether the input scale is read on a checked step after ``checks_done`` earlier ones:
    each of the first :data:`FIRST_CHECKS`, then every :data:`EVERY_CHECK`-th. Pure."""
    return checks_done < FIRST_CHECKS or (checks_done - FIRST_CHECKS) % EVERY_CHECK == EVERY_CHECK - 1


def feature_dim(module: nn.Module, x: torch.Tensor) -> int:
    """The dimension of ``x`` that holds the features ``module`` mixes: the channels (dim 1, or 0
    unbatched) of a convolution's input, the last dimension otherwise (Linear, RNN, Conv1D)."""
    if isinstance(module, nn.modules.conv._ConvNd):
        return 1 if x.dim() == module.weight.dim() else 0
    return x.dim() - 1


def _other_dims(x: torch.Tensor, dim: int) -> tuple[int, ...]:
    return tuple(d for d in range(x.dim()) if d != dim)


def feature_rms(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Per-feature RMS of ``x`` over every dimension but ``dim`` (1-d float32, on the device).
    Non-finite entries make their feature's value non-finite: the NaN/Inf readers own those."""
    x = x.detach()
    x = x if x.dtype in (torch.float32, torch.float64) else x.float()
    # squares summed in place over the other dims: a norm over a strided (non-innermost) dim,
    # or over a moved copy, runs several times slower on the CPU, on every checked step
    dims = _other_dims(x, dim)
    sq = (x * x).sum(dim=dims) if dims else x * x
    return (sq / max(1, x.numel() // max(1, x.shape[dim]))).sqrt().float()


def feature_abs_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Per-feature maximum of ``|x|`` over every dimension but ``dim`` (1-d float32)."""
    x = x.detach()
    dims = _other_dims(x, dim)
    a = x.abs()
    return (a.amax(dim=dims) if dims else a).float()


def running_max(prev: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of ``prev`` and ``new`` over finite values (on the device, no sync):
    a non-finite value never enters (the NaN/Inf readers own those), and a layer whose feature
    count changed (a lazy module) starts over."""
    new = torch.nan_to_num(new, nan=0.0, posinf=0.0, neginf=0.0)  # one kernel
    if prev is None or prev.shape != new.shape:
        return new
    return torch.maximum(prev, new.to(prev.device))


def off_scale(rms: list[float], cut: float = INPUT_RMS_LARGE) -> list[int]:
    """Indices of the features whose RMS is above ``cut``, the largest first. Pure."""
    return sorted((i for i, r in enumerate(rms) if math.isfinite(r) and r > cut), key=lambda i: -rms[i])


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` normalizes (torch's norm classes, or a library class named ``...Norm``
    that owns no weight matrix: ``T5LayerNorm``, ``LlamaRMSNorm``)."""
    name = type(module).__name__
    return name in NORM_TYPES or (name.endswith("Norm") and not owns_matrix(module))


def owns_matrix(module: nn.Module) -> bool:
    """Whether ``module`` multiplies its input by a weight matrix it owns: a ``weight`` (Linear,
    Conv, HF's Conv1D, PyG's Linear) or an RNN's ``weight_ih_l0`` of ``dim >= 2``. Other
    matrices (a class token, position embeddings) are added, not applied; an embedding reads ids."""
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return False
    w = getattr(module, "weight_ih_l0", None) if isinstance(module, nn.RNNBase) else getattr(module, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() >= 2


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor subclass without a plain storage
        return None


@register_measurement
class InputScale(Measurement):
    """Per-feature input RMS of the entry layers on checked steps (see the module docstring)."""

    signatures = (INPUT_RMS_MAX, INPUT_RMS_FIRST, INPUT_ABS_MAX, INPUT_OFF_SCALE, INPUT_FEATURES, INPUT_NORMALIZED_AT)
    unchecked = ()  # its hooks are out of the model on unchecked steps; a step's inputs reset at its close

    def __init__(self) -> None:
        self._ctx: AddonContext | None = None
        self._handles: list[Any] = []
        self._cand: dict[str, Any] = {}          # candidate name -> its hook handle
        # storages of the model inputs of this step -> the input tensor, held to the step's close:
        # a storage address alone could be recycled by the allocator within the step (an input
        # freed after its call, a hidden activation allocated at the same address), and that
        # activation's layer would then read as an entry layer, on some runs and not others
        self._inputs: dict[int, torch.Tensor] = {}
        self._float_in = False                   # a float model input was seen
        self._int_in = False                     # an integer one (token ids) was seen
        self._rms: dict[str, torch.Tensor] = {}  # entry layer -> running per-feature max RMS
        self._abs: dict[str, torch.Tensor] = {}
        self._first: dict[str, torch.Tensor] = {}  # entry layer -> per-feature RMS of its first measured step
        self._norm_entry: str | None = None
        self._known = False                      # the entry layers are known (candidates pruned)
        self._root_called = False                # the root's forward ran in this step
        self._at: int | None = None
        self._checks = 0                         # checked steps closed since the entry layers were known
        self._due = True                         # this checked step reads the input scale

    def enter(self, ctx: AddonContext) -> None:
        """Hook the model's inputs (root and direct children) and every candidate entry layer."""
        self._ctx = ctx
        root = ctx.root
        # every hook here reads checked forwards only: out of the model on unchecked steps
        self._handles.append(self._hook(root, partial(self._on_model_input, True), with_kwargs=True))
        for _, child in root.named_children():
            # a loop that calls the sub-networks directly (a GAN, a Lightning module's model) never
            # runs the root's forward: their inputs are then the model's
            self._handles.append(self._hook(child, partial(self._on_model_input, False), with_kwargs=True))
        for name, mod in root.named_modules():
            if owns_matrix(mod) or is_norm(mod):
                name = name or type(mod).__name__  # the root itself (a bare Linear)
                self._cand[name] = self._hook(mod, lambda m, args, name=name: self._guarded(self._on_layer, name, m,
                                                                                            args))

    def _hook(self, mod: nn.Module, fn: Any, with_kwargs: bool = False) -> Any:
        handle = mod.register_forward_pre_hook(fn, with_kwargs=with_kwargs)
        self._ctx.checked_only(handle, fn)
        return handle

    def _guarded(self, fn: Any, *args: Any) -> None:
        """Run a hook's body; a failure is reported once and turns the measurement off, never
        raised into the training loop."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - the monitor must not raise into training
            self._ctx.report(("input_scale", type(e).__name__), f"input-scale statistics failed and are off: {e!r}")
            self._remove()
        return None

    def _on_model_input(self, is_root: bool, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._guarded(self._read_model_input, is_root, args, kwargs)

    def _read_model_input(self, is_root: bool, args: tuple, kwargs: dict) -> None:
        ctx = self._ctx
        if not self._due or torch.compiler.is_compiling() or ctx is None or not ctx.measuring():
            return None
        if is_root:
            self._root_called = True
        elif self._root_called:  # a child of a root that ran: its input is a hidden activation
            return None
        for t in tensors_of(args, kwargs):
            if not t.is_floating_point():
                self._int_in = True
            elif not t.is_sparse and t.numel() > 0:
                s = _storage(t)
                if s is not None:
                    self._inputs[s] = t
                    self._float_in = True
        return None

    def _on_layer(self, name: str, module: nn.Module, args: tuple) -> None:
        ctx = self._ctx
        if not self._due or not self._inputs or not args or torch.compiler.is_compiling() or not ctx.measuring():
            return None
        x = args[0]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0 or x.is_sparse or \
                _storage(x) not in self._inputs:
            return None
        if is_norm(module):
            self._norm_entry = self._norm_entry or name
            return None
        if self._at is None:
            self._at = ctx.step
        # the readings are of x.detach(): no graph, no grad-mode switch needed
        d = feature_dim(module, x)
        rms = feature_rms(x, d)
        self._rms[name] = running_max(self._rms.get(name), rms)
        self._abs[name] = running_max(self._abs.get(name), feature_abs_max(x, d))
        if ctx.step == self._at:  # the first measured step (all its micro-batches)
            self._first[name] = running_max(self._first.get(name), rms)
        return None

    def step_closed(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """After the first measured forward that saw a float model input, keep only the hooks of
        the entry layers found and, when the root's forward ran, the root's own (the others
        would cost a call per forward for nothing)."""
        if checked and self._float_in and not self._known:
            self._known = True
            for name, h in list(self._cand.items()):
                if name not in self._rms and name != self._norm_entry:
                    ctx.release(h)
                    del self._cand[name]
            if self._root_called:  # the loop calls the root: its children's inputs never count
                for h in self._handles[1:]:
                    ctx.release(h)
                self._handles = self._handles[:1]
        if checked and self._known:
            # counted from the step the entry layers became known, so the first FIRST_CHECKS
            # readings are the run's first (a run without float inputs never counts)
            self._due = check_due(self._checks)
            self._checks += 1
        self._inputs = {}
        self._root_called = False

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Remove every hook."""
        self._remove()

    def _remove(self) -> None:
        for h in self._handles + list(self._cand.values()):
            self._ctx.release(h)
        self._handles, self._cand = [], {}

    def summary(self) -> dict[Any, Any]:
        """The largest per-feature RMS and ``|x|`` over the entry layers, the features above the
        cut (named ``layer[i]``), the feature count; the normalizing entry layer, if one. One host
        transfer."""
        out: dict[Any, Any] = {}
        if self._norm_entry is not None:
            out[INPUT_NORMALIZED_AT] = self._norm_entry
        if not self._rms:
            return out
        names = sorted(self._rms)
        firsts = sorted(self._first)
        dev = self._rms[names[0]].device
        flat = torch.cat([self._rms[n].to(dev) for n in names] + [self._abs[n].to(dev) for n in names]
                         + [self._first[n].to(dev) for n in firsts]).cpu().tolist()
        sizes = [self._rms[n].numel() for n in names]
        n_feat = sum(sizes)
        rms, absmax, first = flat[:n_feat], flat[n_feat:2 * n_feat], flat[2 * n_feat:]
        labels = [f"{n}[{i}]" for n, k in zip(names, sizes) for i in range(k)]
        out[INPUT_RMS_MAX] = max(rms)
        out[INPUT_ABS_MAX] = max(absmax)
        out[INPUT_FEATURES] = n_feat
        if first:
            out[INPUT_RMS_FIRST] = max(first)
        bad = off_scale(rms)
        if bad:
            shown = ", ".join(f"{labels[i]} rms {rms[i]:.3g}" for i in bad[:NAMED_FEATURES])
            more = f" and {len(bad) - NAMED_FEATURES} more" if len(bad) > NAMED_FEATURES else ""
            out[INPUT_OFF_SCALE] = f"{len(bad)} of {n_feat} features: {shown}{more}"
        return out

    def steps(self) -> dict[Any, int]:
        """Measured from the first checked step an entry layer was seen on."""
        if self._at is None:
            return {}
        return {INPUT_RMS_MAX: self._at, INPUT_RMS_FIRST: self._at, INPUT_ABS_MAX: self._at, INPUT_FEATURES: self._at}

    def gaps(self) -> dict[Any, str]:
        """Why nothing was measured: no float input, or no weight layer reads it directly."""
        if self._rms or self._norm_entry is not None or (self._int_in and not self._float_in):
            return {}  # measured, or integer inputs only (token ids: no scale to read)
        if not self._float_in:
            why = "no float model input was seen on a checked step"
        else:
            why = "no weight layer reads the model's float input directly (it is transformed first)"
        return {INPUT_RMS_MAX: why}
