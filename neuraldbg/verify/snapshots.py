"""Bounded, opt-in checkpoints of a monitored run: what :func:`neuraldbg.verify.api.verify` replays from.

``NeuralDbg(model, optimizer=opt, snapshots=True)`` (or ``snapshots=K``) attaches a
:class:`Snapshots` add-on. It keeps, as CPU copies:

* the state at the first step, always (taken on entry, before the first forward);
* a ring of at most ``K`` more, taken on checked steps that are multiples of a spacing
  ``d``; when the ring overflows, the snapshots off the multiples of ``2 d`` are dropped and
  ``d`` doubles. The ring so spans the whole run at a spacing that doubles as it grows
  (``d`` is about ``steps / K``), and the latest snapshot is never more than ``d`` steps old.

A snapshot holds every parameter and buffer of the model, the optimizer's state, the torch
RNG state (CPU, and CUDA when initialized), the ``GradScaler`` state when the monitor was
given one, and whatever was added with :meth:`Snapshots.track` (an LR scheduler, a second
optimizer, a data iterator's position). Off by default: without ``snapshots=`` nothing here
runs. The add-on also records the model inputs' mean and standard deviation over the first
:data:`WARMUP_CALLS` training forwards, the reference the data-shift intervention
standardizes to.

:class:`Snapshots` is a part of the monitor (``neuraldbg/lifecycle.py``): it sees the monitor
through its :class:`~neuraldbg.lifecycle.AddonContext` only, so this package never imports the
monitor (the monitor imports it).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from neuraldbg.lifecycle import Addon, AddonContext

log = logging.getLogger("neuraldbg")

#: Ring size of ``snapshots=True``.
DEFAULT_K = 16
#: Training forwards whose input statistics make the data-shift reference.
WARMUP_CALLS = 8


def _copy_tree(obj: Any) -> Any:
    """A deep copy of a state (dicts, lists, tuples of tensors and plain values), tensors on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _copy_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copy_tree(v) for v in obj)
    return obj


def _tree_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tree_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tree_bytes(v) for v in obj)
    return 0


def _cuda_rng() -> list[torch.Tensor] | None:
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.get_rng_state_all()
    except Exception:  # noqa: BLE001 - a broken CUDA setup: the CPU state still counts
        pass
    return None


@dataclass
class Snapshot:
    """One checkpoint (internal: it holds tensors). ``grads`` and ``training`` are kept only
    for the state :func:`~neuraldbg.verify.api.verify` puts back at its end."""

    step: int
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    optimizer: dict | None
    rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None
    scaler: dict | None
    extras: list[Any]
    grads: dict[str, torch.Tensor | None] | None = None
    training: dict[str, bool] | None = None
    nbytes: int = 0


def capture(root: nn.Module, optimizer: Any, scaler: Any, step: int,
            tracked: list[tuple[Callable[[], Any], Callable[[Any], None]]] = (), full: bool = False) -> Snapshot:
    """Copy the state of ``root``/``optimizer``/RNG/``scaler``/tracked objects to the CPU.
    ``full`` also keeps gradients and train/eval flags (the end-of-run state)."""
    with torch.no_grad():
        params = {n: p.detach().to("cpu", copy=True) for n, p in root.named_parameters()}
        buffers = {n: b.detach().to("cpu", copy=True) for n, b in root.named_buffers()}
    opt = _copy_tree(optimizer.state_dict()) if optimizer is not None else None
    snap = Snapshot(step=step, params=params, buffers=buffers, optimizer=opt, rng=torch.get_rng_state(),
                    cuda_rng=_cuda_rng(), scaler=_copy_tree(scaler.state_dict()) if scaler is not None else None,
                    extras=[save() for save, _ in tracked])
    if full:
        snap.grads = {n: (p.grad.detach().to("cpu", copy=True) if p.grad is not None else None)
                      for n, p in root.named_parameters()}
        snap.training = {n: m.training for n, m in root.named_modules()}
    snap.nbytes = (_tree_bytes(params) + _tree_bytes(buffers) + _tree_bytes(opt) + _tree_bytes(snap.grads)
                   + snap.rng.numel() + sum(t.numel() for t in snap.cuda_rng or ()))
    return snap


def restore(snap: Snapshot, root: nn.Module, optimizer: Any, scaler: Any,
            tracked: list[tuple[Callable[[], Any], Callable[[Any], None]]] = ()) -> None:
    """Put ``snap`` back into the live objects, in place (parameters keep their identity, so
    the optimizer still points at them). ``RuntimeError`` if the model changed shape."""
    params = dict(root.named_parameters())
    buffers = dict(root.named_buffers())
    if set(params) != set(snap.params) or set(buffers) != set(snap.buffers):
        raise RuntimeError("the model's parameters or buffers changed since the snapshot was taken; "
                           "verify cannot restore it")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(snap.params[n])
        for n, b in buffers.items():
            b.copy_(snap.buffers[n])
    if snap.grads is not None:
        for n, p in params.items():
            g = snap.grads[n]
            p.grad = None if g is None else g.to(p.device, copy=True)
    if snap.training is not None:
        for n, m in root.named_modules():
            if n in snap.training:
                m.training = snap.training[n]
    if optimizer is not None and snap.optimizer is not None:
        # a fresh copy each time: load_state_dict keeps tensors that already match, and the
        # next optimizer step would then write into the snapshot
        optimizer.load_state_dict(_copy_tree(snap.optimizer))
    if scaler is not None and snap.scaler is not None:
        scaler.load_state_dict(_copy_tree(snap.scaler))
    for (_, load), state in zip(tracked, snap.extras):
        load(state)
    torch.set_rng_state(snap.rng)
    if snap.cuda_rng is not None:
        torch.cuda.set_rng_state_all(snap.cuda_rng)


@dataclass
class InputStats:
    """Mean and std of each floating model input over the first training forwards
    (``key`` is an argument position or a keyword), kept on the device until read."""

    samples: dict[Any, list[torch.Tensor]] = field(default_factory=dict)
    calls: int = 0

    def add(self, key: Any, x: torch.Tensor) -> None:
        """Queue one input's (mean, std), computed on its device (no host sync)."""
        with torch.no_grad():
            xf = x.detach().float()
            self.samples.setdefault(key, []).append(torch.stack((xf.mean(), xf.std())))

    def reference(self) -> dict[Any, tuple[float, float]]:
        """``key -> (median mean, median std)`` over the finite samples (one host transfer)."""
        out = {}
        for key, rows in self.samples.items():
            vals = [r for r in torch.stack(rows).cpu().tolist() if all(map(math.isfinite, r)) and r[1] > 0]
            if vals:
                ms = sorted(v[0] for v in vals)
                ss = sorted(v[1] for v in vals)
                out[key] = (ms[len(ms) // 2], ss[len(ss) // 2])
        return out


def floating_inputs(args: tuple, kwargs: dict) -> list[tuple[Any, torch.Tensor]]:
    """``(position or keyword, tensor)`` of every dense floating tensor among a forward's inputs."""
    items = list(enumerate(args)) + sorted((kwargs or {}).items())
    return [(k, v) for k, v in items if isinstance(v, torch.Tensor) and v.is_floating_point()
            and not v.is_sparse and v.numel() > 1]


class Snapshots(Addon):
    """The snapshot add-on of one monitor (see the module docstring).

    ``k``: ring size (``>= 1``). ``references(module, shape)`` gives the reference weight stds
    of a layer (the initialization signature's, handed over by the monitor) for the
    re-initialization intervention.
    """

    def __init__(self, k: int = DEFAULT_K, references: Callable[[nn.Module, torch.Size], tuple] | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"snapshots must be True, False/None or an int K >= 1, got {k!r}")
        self.k = k
        self.references = references
        self.spacing = 1
        self.first: Snapshot | None = None
        self.ring: list[Snapshot] = []
        self.taken = 0
        self.tracked: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []
        self.inputs = InputStats()
        self._ctx: AddonContext | None = None
        self._pending: int | None = None
        self._handles: list[Any] = []
        self._input_hook: Any = None

    # ---- what the monitor calls ---------------------------------------------------
    def enter(self, ctx: AddonContext) -> None:
        """Take the first snapshot (before the first forward) and start the input reference."""
        self._ctx = ctx
        self.first = self._take(ctx.step)
        # eager even under torch.compile (its counter would recompile the graph every call),
        # and removed once the reference is complete
        self._input_hook = ctx.root.register_forward_pre_hook(torch.compiler.disable(self._on_input),
                                                              with_kwargs=True)
        self._handles.append(self._input_hook)

    #: a record_loss loop's snapshot is taken after the update that follows the checked step's
    #: start, which belongs to the step before it (checked or not)
    unchecked = ("optimizer_post",)

    def step_started(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """A checked step on the spacing: snapshot now when the loop sets ``dbg.step`` (before
        the forward), else after this step's optimizer update (``record_loss`` opened it early)."""
        if not checked or step <= (self.first.step if self.first else 0) or step % self.spacing:
            return
        if ctx.steps_set_by_loop:
            self._add(self._take(step))
        else:
            self._pending = step

    def optimizer_post(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """The snapshot a ``record_loss`` loop's step asked for, after its update."""
        if self._pending is not None:
            step, self._pending = self._pending, None
            try:
                self._add(self._take(step))
            except Exception as e:  # noqa: BLE001 - never raise into the training loop
                log.warning("neuraldbg: snapshot at step %d failed: %r", step, e)

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Remove the add-on's hooks; the snapshots stay for :meth:`NeuralDbg.verify`."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._pending = None

    # ---- the ring -----------------------------------------------------------------
    def _take(self, step: int) -> Snapshot:
        ctx = self._ctx
        self.taken += 1
        return capture(ctx.root, ctx.optimizer, ctx.settings.scaler, step, self.tracked)

    def _add(self, snap: Snapshot) -> None:
        self.ring.append(snap)
        while len(self.ring) > self.k:
            self.spacing *= 2
            self.ring = [s for s in self.ring if s.step % self.spacing == 0]

    def _on_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.inputs.calls >= WARMUP_CALLS or not module.training or not torch.is_grad_enabled():
            return None
        try:
            self.inputs.calls += 1
            for key, x in floating_inputs(args, kwargs):
                self.inputs.add(key, x)
            if self.inputs.calls >= WARMUP_CALLS and self._input_hook is not None:
                self._input_hook.remove()
        except Exception as e:  # noqa: BLE001 - never raise into the training loop
            log.warning("neuraldbg: input statistics for snapshots failed: %r", e)
        return None

    # ---- what verify reads ----------------------------------------------------------
    def track(self, obj: Any = None, *, save: Callable[[], Any] | None = None,
              load: Callable[[Any], None] | None = None) -> None:
        """Also snapshot ``obj`` (anything with ``state_dict``/``load_state_dict``: an LR
        scheduler, a second optimizer) or the pair ``save() -> state`` / ``load(state)``."""
        if obj is not None:
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"track() needs an object with state_dict/load_state_dict, got {type(obj).__name__}")
            save, load = (lambda: _copy_tree(obj.state_dict())), (lambda s: obj.load_state_dict(_copy_tree(s)))
        if save is None or load is None:
            raise TypeError("track() takes an object, or both save= and load=")
        self.tracked.append((save, load))
        # snapshots taken before tracking started cannot restore it: tracking starts with the run
        for snap in self.all():
            snap.extras.append(save())

    def all(self) -> list[Snapshot]:
        """Every snapshot held, oldest first."""
        return ([self.first] if self.first is not None else []) + list(self.ring)

    def before(self, step: int) -> Snapshot | None:
        """The latest snapshot taken at or before ``step`` (its state is the one before that
        step's forward)."""
        cands = [s for s in self.all() if s.step <= step]
        return cands[-1] if cands else None

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data the snapshots hold (CPU memory)."""
        return sum(s.nbytes for s in self.all())


def make_snapshots(value: Any, references: Callable | None = None) -> Snapshots | None:
    """The add-on ``NeuralDbg(snapshots=value)`` asks for: ``None`` for ``None``/``False``/``0``,
    ``K = 16`` for ``True``, else ``K = value``; ``ValueError`` naming the valid values."""
    if value is None or value is False:
        return None
    if value is True:
        return Snapshots(DEFAULT_K, references)
    if isinstance(value, int) and not isinstance(value, bool):
        if value == 0:
            return None
        return Snapshots(value, references)
    raise ValueError(f"snapshots must be True, False/None or an int K >= 1, got {value!r}")


def of(dbg: Any) -> Snapshots | None:
    """The :class:`Snapshots` add-on of a monitor, or ``None`` when it was built without."""
    return dbg.addon(Snapshots)
