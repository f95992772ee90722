"""Shared test fixtures: a tiny training run, a tensor subclass, a trace builder and a spy.

``run`` trains a small model for a few steps on a seeded, learnable task (the class is the
largest of the first ``classes`` inputs) with or without a monitor, in either loop style; the
trace builder makes :class:`~neuraldbg.trace.Trace` s by hand, with signatures named by their
declared names (an undeclared name is an error, as it is for the monitor). ``tagged`` turns a
model's parameters into :class:`Tagged` tensors, a subclass the monitor does not measure;
``spy_steps`` collects the per-step statistics a monitor hands its detectors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.causal.nodes import check_signature
from neuraldbg.monitor.feed import EventFeed
from neuraldbg.trace import LayerInfo, LossSummary, Signatures, Trace

# ---- a tiny training run ---------------------------------------------------------------

def batches(steps: int, *, n: int = 16, d: int = 8, classes: int = 3, seed: int = 0,
            empty_at: Iterable[int] = ()) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` seeded batches of a learnable task; ``empty_at``: steps whose batch has no rows."""
    gen = torch.Generator().manual_seed(seed)
    empty = set(empty_at)
    out = []
    for step in range(steps):
        x = torch.randn(0 if step in empty else n, d, generator=gen)
        out.append((x, x[:, :classes].argmax(dim=1)))
    return out


def mlp(d: int = 8, hidden: int = 16, classes: int = 3) -> nn.Module:
    """A two-layer ReLU MLP for :func:`batches`."""
    return nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, classes))


@dataclass
class TinyRun:
    """What :func:`run` returns."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    losses: list[torch.Tensor]
    dbg: NeuralDbg | None
    params: list[torch.Tensor] = field(default_factory=list)


def run(model: nn.Module | None = None, *, steps: int = 30, monitor: Mapping[str, Any] | None = None,
        optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.SGD, lr: float = 0.05,
        data: list[tuple[torch.Tensor, torch.Tensor]] | None = None, set_step: bool = False,
        seed: int = 0, dbg: NeuralDbg | None = None, before_step: Callable[[int], None] | None = None,
        on_step: Callable[[int], None] | None = None) -> TinyRun:
    """Train ``model`` (default: :func:`mlp`, seeded) on ``data`` (default: :func:`batches`).

    ``monitor``: ``None`` (no monitor) or the keyword arguments of :class:`NeuralDbg`, where
    ``optimizer=True`` stands for the optimizer made here; the monitor is entered and exited
    around the loop, also when it raises. ``dbg``: instead, a monitor the caller built and
    enters itself (the loop only records losses into it). ``set_step``: the loop sets
    ``dbg.step`` (else ``record_loss`` closes each step). ``before_step(step)`` runs before
    each forward, ``on_step(step)`` after each update.
    """
    if model is None:
        torch.manual_seed(seed)
        model = mlp()
    opt = optimizer(model.parameters(), lr=lr)
    data = batches(steps, seed=seed) if data is None else data
    kwargs = dict(monitor) if monitor is not None else None
    if kwargs is not None and kwargs.get("optimizer") is True:
        kwargs["optimizer"] = opt
    own = NeuralDbg(model, **kwargs) if kwargs is not None else None
    dbg = own if own is not None else dbg
    losses = []
    if own is not None:
        own.__enter__()
    try:
        for step, (x, y) in enumerate(data[:steps]):
            if before_step is not None:
                before_step(step)
            if dbg is not None and set_step:
                dbg.step = step
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if dbg is not None:
                dbg.record_loss(loss)
            opt.step()
            losses.append(loss.detach().clone())
            if on_step is not None:
                on_step(step)
    finally:
        if own is not None:
            own.__exit__(None, None, None)
    return TinyRun(model, opt, losses, dbg, [p.detach().clone() for p in model.parameters()])


# ---- a tensor subclass the monitor does not measure -----------------------------------

class Tagged(torch.Tensor):
    """A pass-through tensor subclass, standing for a quantized or sharded weight type: every op
    works, but its type is not the plain dense tensor the monitor's statistics read."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def tagged(model: nn.Module, names: tuple[str, ...] = ("weight", "bias")) -> nn.Module:
    """``model`` with its parameters named in ``names`` turned into :class:`Tagged` parameters."""
    for mod in model.modules():
        for n, p in list(mod.named_parameters(recurse=False)):
            if n in names:
                setattr(mod, n, nn.Parameter(p.data.as_subclass(Tagged)))
    return model


# ---- a trace builder -------------------------------------------------------------------

def signatures(values: Mapping[str, Any] | None = None, steps: Mapping[str, int] | None = None) -> Signatures:
    """Signatures by declared name, each checked against its declaration."""
    values = dict(values or {})
    return Signatures({k: check_signature(k, v) for k, v in values.items()}, steps)


def loss_summary(values: list[float], first_step: int = 0, nonfinite_step: int | None = None) -> LossSummary:
    """A :class:`LossSummary` of one loss per step from ``first_step``."""
    finite = [v for v in values if math.isfinite(v)]
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    first_bad = nonfinite_step if nonfinite_step is not None else (first_step + bad[0] if bad else None)
    return LossSummary(n=len(values), first=values[0] if values else None, last=values[-1] if values else None,
                       min=min(finite) if finite else None, n_nonfinite=len(bad), first_nonfinite_step=first_bad,
                       history=tuple((first_step + i, v) for i, v in enumerate(values)))


def make_trace(events: Iterable[Any] = (), layers: Iterable[LayerInfo] = (), losses: list[float] | None = None,
               family: str = "mlp", steps: int | None = None, sigs: Mapping[str, Any] | None = None,
               sig_steps: Mapping[str, int] | None = None, nonfinite_step: int | None = None, **fields: Any) -> Trace:
    """A trace from step 0 over ``steps`` steps (default: the losses' count); ``sigs`` by name,
    ``sig_steps`` the steps some of them were measured by."""
    losses = list(losses) if losses is not None else None
    n = steps if steps is not None else max(len(losses or ()), 1)
    loss = loss_summary(losses, nonfinite_step=nonfinite_step) if losses is not None else LossSummary()
    return Trace(events=tuple(sorted(events, key=lambda e: (e.step, e.layer or ""))), layers=tuple(layers),
                 family=family, first_step=0, last_step=max(n - 1, 0), loss=loss,
                 signatures=signatures(sigs, sig_steps),
                 **fields)


def spy_steps(monkeypatch, out: list | None = None) -> list:
    """Every StepStats a monitor made after this call reads back from its transfer, in order
    (appended to ``out``): a spy on the feed that hands each to the detectors."""
    out = [] if out is None else out
    orig = EventFeed._consume

    def consume(self, st):
        out.append(st)
        return orig(self, st)

    monkeypatch.setattr(EventFeed, "_consume", consume)
    return out
