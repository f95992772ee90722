"""Dead units of activations applied as functions (``F.relu``), read where the next layer takes them in.

A model whose activations are all functions has no activation module for a hook to see, so the
activation detector (``neuraldbg/events/activation.py``) never measures its dead units. A ReLU's
dead unit is still visible one step later: the weight layer it feeds receives that feature as
zero on the whole batch, in an input with no negative value (what a ReLU-like function leaves).
This measurement reads exactly that, only on models with no activation module at all
(:func:`neuraldbg.causal.nodes.layers.functional_activations`; any other model costs nothing):

* on checked training forwards, the input of every weight layer (:func:`weight_layer`: Linear,
  convolutions, a library's own Linear) but the first one the model runs (it reads the data,
  whose zero features -- an image's dark border -- are no dead units): the share of its
  features (channels for a convolution) whose maximum over the batch is 0, counted only when
  the input has no negative value; reduced on the device, with the run of consecutive dead
  checks and the step it started kept there too;
* a layer whose input is dead by at least ``DetectorConfig.dead_fraction`` on
  ``regime_persistence`` checks in a row becomes a ``dead`` activation event at the first of
  them, named after the layer that receives the dead features (one host transfer per query);
* ``functional_relu_layers``: how many weight layers received a non-negative input, i.e. sit
  behind a ReLU-like function; with none, dead units are not observable in this model.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from neuraldbg.causal.nodes.layers import FUNCTIONAL_RELU_LAYERS, functional_activations
from neuraldbg.events.base import ACTIVATION, make_event
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.measurements.input_scale import owns_matrix



def weight_layer(module: nn.Module) -> bool:
    """Whether ``module``'s input is read: it multiplies it by a weight matrix it owns (Linear,
    convolutions, a library's own Linear such as PyG's), an RNN's input excepted (its gates apply
    their own functions, so a ReLU-like input is not what it receives)."""
    return owns_matrix(module) and not isinstance(module, nn.RNNBase)


def dead_input_share(x: torch.Tensor, channels_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(share, non_negative)``: the share of ``x``'s features whose maximum over every other
    dimension is 0, when ``x`` has no negative value (0 otherwise; 0-d float32), and whether it
    has none (0-d bool); on the device, no sync. Features are the channels (dim 1) of a
    convolution's batched input, the last dimension otherwise."""
    x = x.detach()
    dim = 1 if channels_first and x.dim() > 2 else x.dim() - 1
    others = tuple(d for d in range(x.dim()) if d != dim)
    top = x.amax(dim=others) if others else x
    share = (top == 0).float().mean()
    nonneg = x.amin() >= 0
    return torch.where(nonneg, share, torch.zeros_like(share)), nonneg


@register_measurement
class FunctionalDeadUnits(Measurement):
    """Dead units of functional activations, read at the inputs of weight layers (module docstring)."""

    signatures = (FUNCTIONAL_RELU_LAYERS,)
    unchecked = ()  # its hooks are out of the model on unchecked steps

    def __init__(self, cut: float, persistence: int) -> None:
        self.cut, self.persistence = float(cut), max(1, int(persistence))
        self._ctx: AddonContext | None = None
        self._handles: list[Any] = []
        self._entry: str | None = None           # the first weight layer run: it reads the data
        self._share: dict[str, torch.Tensor] = {}  # layer -> this check's dead share (device)
        self._run: dict[str, torch.Tensor] = {}    # layer -> consecutive dead checks
        self._start: dict[str, torch.Tensor] = {}  # layer -> step the current run started
        self._first: dict[str, torch.Tensor] = {}  # layer -> step of the first persistent run (-1)
        self._peak: dict[str, torch.Tensor] = {}   # layer -> the largest dead share
        self._nonneg: dict[str, torch.Tensor] = {}  # layer -> whether an input had no negative value
        self._reported: set[str] = set()

    @classmethod
    def for_monitor(cls, root: Any, settings: Any) -> "FunctionalDeadUnits | None":
        """Only models whose activations are all functions (no activation module)."""
        if not functional_activations({type(m).__name__ for m in root.modules()}):
            return None
        if not any(weight_layer(m) for m in root.modules()):
            return None
        return cls(settings.config.dead_fraction, settings.config.regime_persistence)

    def enter(self, ctx: AddonContext) -> None:
        """Hook the input of every weight layer, on checked steps only."""
        self._ctx = ctx
        for name, mod in ctx.root.named_modules():
            if weight_layer(mod):
                fn = partial(self._guarded, name or type(mod).__name__, isinstance(mod, nn.modules.conv._ConvNd))
                handle = mod.register_forward_pre_hook(fn)
                ctx.checked_only(handle, fn)
                self._handles.append(handle)

    def _guarded(self, name: str, conv: bool, module: nn.Module, args: tuple) -> None:
        try:
            self._read(name, conv, args)
        except Exception as e:  # noqa: BLE001 - the monitor must not raise into training
            self._ctx.report(("functional_dead", type(e).__name__), f"dead-unit statistics of functional activations "
                                                                    f"failed and are off: {e!r}")
            self._remove()
        return None

    def _read(self, name: str, conv: bool, args: tuple) -> None:
        ctx = self._ctx
        if ctx is None or not ctx.measuring() or torch.compiler.is_compiling() or not args:
            return None
        x = args[0]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            return None
        if self._entry is None:
            self._entry = name
        if name == self._entry:
            return None
        share, nonneg = dead_input_share(x, conv)
        # a layer called twice in a step (shared) is dead only where it is dead every time
        prev = self._share.get(name)
        self._share[name] = share if prev is None else torch.minimum(prev, share)
        seen = self._nonneg.get(name)
        self._nonneg[name] = nonneg if seen is None else seen | nonneg

    def step_closed(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """Fold this check's shares into each layer's run of dead checks (on the device)."""
        if not checked or not self._share:
            return None
        for name, share in self._share.items():
            hit = share >= self.cut
            if name not in self._run:
                dev = share.device
                self._run[name] = torch.zeros((), dtype=torch.int64, device=dev)
                self._start[name] = torch.full((), -1, dtype=torch.int64, device=dev)
                self._first[name] = torch.full((), -1, dtype=torch.int64, device=dev)
                self._peak[name] = torch.zeros((), device=dev)
            run, start = self._run[name], self._start[name]
            start = torch.where(hit & (run == 0), torch.full_like(start, step), start)
            run = torch.where(hit, run + 1, torch.zeros_like(run))
            first = self._first[name]
            self._first[name] = torch.where((run >= self.persistence) & (first < 0), start, first)
            self._run[name], self._start[name] = run, start
            self._peak[name] = torch.maximum(self._peak[name], share)
        self._share = {}
        return None

    def flush(self, ctx: AddonContext) -> None:
        """Turn each newly persistent dead input into a ``dead`` event (one host transfer)."""
        names = [n for n in self._first if n not in self._reported]
        if not names:
            return None
        dev = self._first[names[0]].device
        vals = torch.stack([torch.stack((self._first[n].to(dev).double(), self._peak[n].to(dev).double()))
                            for n in names]).tolist()
        for name, (first, peak) in zip(names, vals):
            if first >= 0:
                self._reported.add(name)
                ctx.add_event(make_event(ACTIVATION, "dead", name, int(first), float(peak),
                                         {"dead_frac": float(peak), "functional": 1.0}))
        return None

    def summary(self) -> dict[Any, Any]:
        """How many weight layers received a non-negative input (behind a ReLU-like function)."""
        if not self._nonneg:
            return {}
        dev = next(iter(self._nonneg.values())).device
        n = int(torch.stack([v.to(dev) for v in self._nonneg.values()]).sum().item())
        return {FUNCTIONAL_RELU_LAYERS: n}

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Remove every hook."""
        self._remove()

    def _remove(self) -> None:
        for h in self._handles:
            self._ctx.release(h)
        self._handles = []
