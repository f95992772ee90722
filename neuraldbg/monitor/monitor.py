"""The training monitor: ``with NeuralDbg(model) as dbg:`` around an unchanged loop.

Hooks observe, they never patch ``forward``. Each hook computes a few reductions on the
device under ``torch.no_grad()`` and appends the result to a per-step buffer; nothing is
moved to the host per hook. When a step ends, its buffer is concatenated (one tensor per
device) and queued; the queue is transferred to the host every ``sync_every`` checked steps,
where detectors turn the numbers into events.
"""
from __future__ import annotations

import logging
import math
import sys
import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Iterable

import torch
from torch import nn

from neuraldbg.config import DetectorConfig
from neuraldbg.events.base import Event
from neuraldbg.events.compress import EventLog, Propagation, compress
from neuraldbg.events.registry import DetectorContext, build_detectors
from neuraldbg.events.stepstats import StepStats
from neuraldbg.monitor import stats as S
from neuraldbg.queries import CausalQueries
from neuraldbg.trace import LayerInfo, LossSummary, Trace

log = logging.getLogger("neuraldbg")

INPUT_KEY = "<input>"
MODULE_CHECK_EVERY = 16


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under ``torch.compile``, ``DataParallel`` and DDP wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        elif isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            break
    return model


def monitored_modules(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaf modules plus any module owning parameters directly (e.g. MultiheadAttention)."""
    out = []
    for name, mod in root.named_modules():
        is_leaf = next(iter(mod.children()), None) is None
        owns = next(iter(mod.parameters(recurse=False)), None) is not None
        if is_leaf or owns:
            out.append((name or type(mod).__name__.lower(), mod))
    return out


class LossHistory:
    """Bounded loss history: keeps every ``stride``-th loss, doubling the stride when full."""

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self.stride = 1
        self.points: list[tuple[int, float]] = []
        self.n = 0
        self.first: float | None = None
        self.last: float | None = None
        self.min: float | None = None
        self.n_nonfinite = 0
        self.first_nonfinite_step: int | None = None

    def add(self, step: int, loss: float) -> None:
        """Record one loss value."""
        if self.n % self.stride == 0:
            self.points.append((step, loss))
            if len(self.points) > self.capacity:
                self.points = self.points[::2]
                self.stride *= 2
        self.n += 1
        if self.first is None:
            self.first = loss
        self.last = loss
        if math.isfinite(loss):
            self.min = loss if self.min is None else min(self.min, loss)
        else:
            self.n_nonfinite += 1
            if self.first_nonfinite_step is None:
                self.first_nonfinite_step = step

    def summary(self) -> LossSummary:
        """A frozen :class:`LossSummary`."""
        return LossSummary(n=self.n, first=self.first, last=self.last, min=self.min,
                           n_nonfinite=self.n_nonfinite, first_nonfinite_step=self.first_nonfinite_step,
                           history=tuple(self.points))


@dataclass
class _StepBuffer:
    step: int
    active: bool
    fwd: list = field(default_factory=list)        # (layer, fields, n, tensor)
    gout: list = field(default_factory=list)       # (layer, n, tensor)
    pgrad: dict = field(default_factory=dict)      # id(param) -> (layer, n, tensor): last wins
    inputs: list = field(default_factory=list)     # (n, tensor)
    losses: list = field(default_factory=list)     # float or 0-d tensor
    scale: Any = None                              # GradScaler scale during this step's backward
    inv_scale: Any = None                          # its reciprocal, multiplied into gradients
    eval_skipped: bool = False                     # forwards skipped because the model was in eval()

    def empty(self) -> bool:
        return not (self.fwd or self.gout or self.pgrad or self.inputs or self.losses)


class NeuralDbg(CausalQueries):
    """Watch a training loop and explain what went wrong.

    Args:
        model: the module being trained (``torch.compile``, ``DataParallel`` and DDP
            wrappers are looked through; hooks go on the user's modules).
        family: architecture family for priors (``mlp``, ``cnn``, ``transformer``, ``gan``,
            ``lora``, ``diffusion``, ``rnn``, ``gnn``, ``rl``); guessed from module types when None.
        optimizer: optional optimizer; recorded in the export (learning rates).
        every: check every Nth step (1 = every step).
        config: detector thresholds (:class:`DetectorConfig` or a dict of its fields).
        detectors: names of registered detectors to run (all by default).
        priors: path of a tuned prior file (default: the family's shipped priors).
        output_grads: also record gradients w.r.t. module outputs (eager mode only).
        sync_every: checked steps batched per host transfer (default 1 on CPU, 16 on GPU).
        scaler: the ``torch.amp.GradScaler`` of a mixed-precision loop, if any. Gradient
            statistics are then divided by the scale in force during backward, and steps whose
            gradients the scaler finds non-finite (it skips them) are not failures unless they
            recur (see ``docs/idioms.md``).
    """

    def __init__(self, model: nn.Module, family: str | None = None, optimizer: Any = None, every: int = 1, *,
                 config: DetectorConfig | dict | None = None, detectors: Iterable[str] | None = None,
                 priors: str | None = None, output_grads: bool = True, sync_every: int | None = None,
                 scaler: Any = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"NeuralDbg expects a torch.nn.Module, got {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        if isinstance(config, dict):
            config = DetectorConfig.from_dict(config)
        elif config is None:
            config = DetectorConfig()
        elif not isinstance(config, DetectorConfig):
            raise TypeError(f"config must be a DetectorConfig or dict, got {type(config).__name__}")
        self.model = model
        self.root = unwrap(model)
        self.family = _resolve_family(self.root, family)
        self.optimizer = optimizer
        self.every = every
        self.config = config
        self.priors_path = str(priors) if priors is not None else None
        self.output_grads = output_grads
        if scaler is not None and not (hasattr(scaler, "scale") and hasattr(scaler, "get_scale")):
            raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        self.scaler = scaler
        self._eval_trains = False  # set when the model is trained in eval() mode (then eval forwards count)
        # layer name -> (weak ref to the hooked module, its hook handles, ids of its params):
        # how replaced or renamed modules are noticed and unhooked (weak: an orphan is freed)
        self._hooked: dict[str, tuple[Any, list, list[int]]] = {}
        self._hooked_params: set[int] = set()
        self._consumed = 0
        self._detector_names = None if detectors is None else list(detectors)
        on_gpu = any(p.is_cuda for p in self.root.parameters())
        self.sync_every = sync_every if sync_every is not None else (16 if on_gpu else 1)
        if self.sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {self.sync_every}")
        self._modules = monitored_modules(self.root)
        self._kinds = {name: S.activation_kind(m) for name, m in self._modules}
        self._handles: list[Any] = []
        self._order: list[str] = []  # forward order of first completion
        self._order_pos: dict[str, int] = {}  # name -> index in _order
        self._reported: set[tuple] = set()
        self._disabled: set[str] = set()
        self._step = 0
        self._user_steps = False
        self._buf = _StepBuffer(0, True)
        self._pending: list = []
        self._detectors = None
        self._log = EventLog(gap=config.collapse_gap_checks * every, layer_index=self._layer_index)
        self._loss = LossHistory()
        self._first_step: int | None = None
        self._last_step = 0
        self._entered = False
        self.rank, self.world_size = _dist_rank()

    # ---- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> "NeuralDbg":
        if self._entered:
            raise RuntimeError("this NeuralDbg is already active; create a new one per run")
        self._entered = True
        _guard_compiled_hooks()
        try:
            self._register()
        except Exception:  # never break training: a monitor that cannot hook degrades to nothing
            self._remove()
            log.exception("neuraldbg: could not register hooks; monitoring is off for this run")
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._remove()
        self._safe(self._close_step, "close")
        self._safe(self._drain, "drain")
        return False

    def _register(self) -> None:
        root = self.root
        self._handles.append(root.register_forward_pre_hook(self._on_input, with_kwargs=True))
        self._hook_modules(self._modules)

    def _hook_modules(self, modules: list[tuple[str, nn.Module]]) -> None:
        owner: dict[int, tuple[str, nn.Parameter]] = {}
        for name, mod in modules:
            kind = self._kinds[name]
            h = mod.register_forward_hook(partial(self._on_output, name, kind, S.bounds_of(mod),
                                                  getattr(mod, "dim", None)))
            self._handles.append(h)
            self._hooked[name] = (weakref.ref(mod), [h], [])
            for p in mod.parameters(recurse=False):
                if p.requires_grad and id(p) not in owner and id(p) not in self._hooked_params:
                    owner[id(p)] = (name, p)
        for name, p in owner.values():
            h = p.register_post_accumulate_grad_hook(partial(self._on_param_grad, name))
            self._handles.append(h)
            self._hooked[name][1].append(h)
            self._hooked[name][2].append(id(p))
            self._hooked_params.add(id(p))

    def _check_modules(self) -> None:
        """Hook modules added or swapped in since the last check (log once per layer name).

        A replaced layer keeps its name but gets a new module; its old hooks stay on the
        orphan (removed on exit) and detectors forget the layer's baselines, which described
        the old weights.
        """
        if not self._handles:
            return  # not active (or registration failed): nothing to keep in sync
        current = monitored_modules(self.root)
        now = dict(current)
        stale = [n for n, (ref, _, _) in self._hooked.items() if now.get(n) is None or ref() is not now[n]]
        new = [(n, m) for n, m in current if n not in self._hooked or self._hooked[n][0]() is not m]
        if not new and not stale:
            return
        for name in stale:
            # the module left the model or moved under another name (e.g. wrapped by an
            # adapter): its hooks would report under a wrong or dead name
            _, handles, pids = self._hooked.pop(name)
            for h in handles:
                h.remove()
            self._hooked_params.difference_update(pids)
        for name, mod in new:
            self._kinds[name] = S.activation_kind(mod)
            self._report(("replaced", name), f"module {name} was added or replaced during training "
                         f"(now {type(mod).__name__}); monitoring the new module", level=logging.INFO)
            for det in self._detectors or ():
                forget = getattr(det, "forget_layer", None)
                if forget is not None:
                    forget(name)
        self._modules = current
        self._hook_modules(new)
        if self._detectors is not None:
            ctx = self._context()  # new layer names join the forward order detectors read
            for det in self._detectors:
                det.context = ctx

    def _remove(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # pragma: no cover - removal of a dead handle is harmless
                pass
        self._handles.clear()

    # ---- step bookkeeping --------------------------------------------------------------
    @property
    def step(self) -> int:
        """The current training step (set it, or let :meth:`record_loss` advance it)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        value = int(value)
        self._user_steps = True
        if value != self._step:
            self._safe(self._close_step, "close")
            self._start_step(value)

    def _start_step(self, value: int) -> None:
        self._step = value
        self._buf = _StepBuffer(value, value % self.every == 0)

    def record_loss(self, loss: float | torch.Tensor) -> None:
        """Record this step's loss (a float or 0-d tensor; no device sync).

        Several calls in one step (set with ``dbg.step``) are averaged. Without ``dbg.step``
        each call ends the step and advances it.
        """
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ValueError(f"record_loss expects a scalar loss, got a tensor of shape {tuple(loss.shape)}")
            self._buf.losses.append(loss.detach().reshape(()))
        elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
            self._buf.losses.append(float(loss))
        else:
            raise TypeError(f"record_loss expects a float or a 0-d tensor, got {type(loss).__name__}")
        if not self._user_steps:
            self._safe(self._close_step, "close")
            self._start_step(self._step + 1)

    # ---- hooks -------------------------------------------------------------------------
    def _skip_forward(self, buf: _StepBuffer) -> bool:
        # validation passes (no_grad, or eval() mode) must not mix into training statistics;
        # a model that is trained in eval() mode is noticed at its first backward (see below)
        if not buf.active or not torch.is_grad_enabled():
            return True
        if not self.root.training and not self._eval_trains:
            buf.eval_skipped = True
            return True
        return False

    def _on_input(self, module, args, kwargs):
        buf = self._buf
        if self._skip_forward(buf):
            return None
        try:
            with torch.no_grad():
                for t in _tensors(args, kwargs):
                    if t.is_floating_point() and not t.is_sparse:
                        buf.inputs.append((t.numel(), S.input_stats(t)))
        except Exception as e:  # noqa: BLE001 - the monitor must not raise into training
            self._report(("input", type(e).__name__), f"input statistics failed: {e!r}")
        return None

    def _on_output(self, name, kind, bounds, dim, module, inputs, output):
        buf = self._buf
        if name in self._disabled or self._skip_forward(buf):
            return None
        try:
            y = _first_tensor(output)
            if y is None or not y.is_floating_point() or y.is_sparse or y.numel() == 0:
                self._report((name, "type"), f"no statistics for the output of {name} "
                             f"({_describe(output)}); skipped", level=logging.INFO)
                return None
            with torch.no_grad():
                stats = S.output_stats(y, kind, bounds=bounds, softmax_dim=dim,
                                       margin=self.config.saturation_margin)
            buf.fwd.append((name, S.fields_for(kind), y.numel(), stats))
            if self.output_grads and y.requires_grad and not _compiling():
                y.register_hook(partial(self._on_out_grad, name, buf, y.numel()))
        except Exception as e:  # noqa: BLE001
            self._disabled.add(name)
            self._report((name, type(e).__name__), f"statistics of {name} failed and are disabled: {e!r}")
        return None

    def _on_out_grad(self, name, buf, n, grad):
        try:
            if buf is self._buf and buf.active and grad is not None:
                with torch.no_grad():
                    buf.gout.append((name, n, S.grad_stats(grad, self._inv_scale(buf))))
        except Exception as e:  # noqa: BLE001
            self._report((name, "gout", type(e).__name__), f"output-gradient statistics failed: {e!r}")
        return None

    def _on_param_grad(self, name, param):
        buf = self._buf
        try:
            if buf.active and param.grad is not None:
                if buf.eval_skipped and not buf.fwd and not self._eval_trains:
                    # a backward after eval()-mode forwards: this model trains in eval mode
                    self._eval_trains = True
                    self._report(("eval_trains",), "the model is trained in eval() mode; its forward "
                                 "passes are now measured in eval mode too", level=logging.INFO)
                with torch.no_grad():
                    buf.pgrad[id(param)] = (name, param.grad.numel(),
                                            S.grad_stats(param.grad, self._inv_scale(buf)))
        except Exception as e:  # noqa: BLE001
            self._report((name, "pgrad", type(e).__name__), f"parameter-gradient statistics failed: {e!r}")
        return None

    def _inv_scale(self, buf: _StepBuffer):
        """1 / the scaler's scale as a device tensor (``None`` without a scaler); no host sync.

        Taken once per step, at its first gradient: ``GradScaler.update()`` changes the scale
        in place after the step, so a copy keeps the scale these gradients were multiplied
        by. Unscaling on the device (before squaring) keeps float32 sums from overflowing
        under the large scales a long run grows to.
        """
        if self.scaler is None:
            return None
        if buf.scale is None:
            sc = self.scaler
            if not sc.is_enabled():
                return None
            t = getattr(sc, "_scale", None)  # private, but the only sync-free view of the scale
            if isinstance(t, torch.Tensor):
                buf.scale = t.detach().reshape(1).float().clone()
            else:  # pragma: no cover - a scaler-like object without a tensor scale
                buf.scale = torch.tensor([float(sc.get_scale())])
            buf.inv_scale = buf.scale.reciprocal()
        return buf.inv_scale

    # ---- step closing and host transfer ----------------------------------------------
    def _close_step(self) -> None:
        buf = self._buf
        if buf.empty():
            return
        self._buf = _StepBuffer(buf.step, buf.active)  # later hooks of this step start afresh
        for name, *_ in buf.fwd:
            if name not in self._order_pos:
                self._order_pos[name] = len(self._order)
                self._order.append(name)
        tensors: list[torch.Tensor] = []
        layout: list[tuple] = []
        for name, fields, n, t in buf.fwd:
            layout.append(("out", name, fields, n))
            tensors.append(t)
        for name, n, t in buf.gout:
            layout.append(("gout", name, S.GRAD_FIELDS, n))
            tensors.append(t)
        for name, n, t in buf.pgrad.values():
            layout.append(("pgrad", name, S.GRAD_FIELDS, n))
            tensors.append(t)
        for n, t in buf.inputs:
            layout.append(("input", INPUT_KEY, S.INPUT_FIELDS, n))
            tensors.append(t)
        if buf.scale is not None:
            layout.append(("scale", None, ("scale",), 1))
            tensors.append(buf.scale)
        floats = [x for x in buf.losses if not isinstance(x, torch.Tensor)]
        dev_losses = [x for x in buf.losses if isinstance(x, torch.Tensor)]
        loss_t = torch.stack([x.float() for x in dev_losses]).mean().reshape(1) if dev_losses else None
        self._pending.append((buf.step, layout, _concat(tensors), loss_t, floats, bool(buf.pgrad or buf.gout)))
        if len(self._pending) >= self.sync_every:
            self._drain()

    def _drain(self) -> None:
        pending, self._pending = self._pending, []
        for step, layout, flat, loss_t, floats, has_bwd in pending:
            host = flat.detach().cpu().tolist() if flat is not None else []
            loss_vals = floats + ([float(loss_t.cpu())] if loss_t is not None else [])
            loss = sum(loss_vals) / len(loss_vals) if loss_vals else None
            st = _to_stepstats(step, layout, host, loss, has_bwd)
            self._consume(st)

    def _consume(self, st: StepStats) -> None:
        self._consumed += 1
        if self._consumed % MODULE_CHECK_EVERY == 1:
            # a walk of named_modules on the host, so only every few checks: catches layers
            # added or swapped mid-run within MODULE_CHECK_EVERY checked steps
            self._safe(self._check_modules, "module check")
        if self._first_step is None:
            self._first_step = st.step
        self._last_step = max(self._last_step, st.step)
        if st.loss is not None:
            self._loss.add(st.step, st.loss)
        if self._detectors is None:
            self._detectors = build_detectors(self._detector_names, self.config, self._context())
        for det in self._detectors:
            try:
                for ev in det.update(st):
                    if self.rank is not None:
                        ev = _with_rank(ev, self.rank)
                    self._log.add(ev)
            except Exception as e:  # noqa: BLE001
                self._report((det.name, type(e).__name__), f"detector {det.name} failed: {e!r}")

    def _layer_index(self, name: str | None) -> int | None:
        return None if name is None else self._order_pos.get(name)

    def _context(self) -> DetectorContext:
        order = tuple(self._order)
        return DetectorContext(family=self.family, layer_order=order,
                               layer_kinds=tuple(sorted(self._kinds.items())),
                               input_layer=order[0] if order else None)

    def _safe(self, fn, what: str) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            self._report(("internal", what, type(e).__name__), f"internal error in {what}: {e!r}")

    def _report(self, key: tuple, msg: str, level: int = logging.WARNING) -> None:
        if key in self._reported:
            return
        self._reported.add(key)
        log.log(level, "neuraldbg: %s", msg)

    def _flush(self) -> None:
        """Process everything recorded so far (queries call this; training is unaffected)."""
        self._safe(self._close_step, "close")
        self._safe(self._drain, "drain")
        if self._detectors is None and self._order:
            self._detectors = build_detectors(self._detector_names, self.config, self._context())

    # ---- results -----------------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        """The collapsed events, in step order."""
        self._flush()
        return self._log.events

    def events_frame(self):
        """The events as a ``pandas.DataFrame`` (one row per collapsed event)."""
        from neuraldbg.session import events_frame

        return events_frame(self.events)

    def propagation(self) -> list[Propagation]:
        """First occurrence and layer-by-layer propagation of each event kind."""
        tr = self.trace()
        return compress(tr.events, tr.layer_index)

    def layers(self) -> tuple[LayerInfo, ...]:
        """Monitored modules in forward order (modules never called come last)."""
        names = list(self._order) + [n for n, _ in self._modules if n not in self._order_pos]
        mods = dict(self._modules)
        return tuple(LayerInfo(name=n, type=type(mods[n]).__name__, index=i,
                               n_params=sum(p.numel() for p in mods[n].parameters(recurse=False)))
                     for i, n in enumerate(names))

    def trace(self) -> Trace:
        """Events plus context, the causal engine's input."""
        events = tuple(self.events)
        meta = {"every": self.every, "optimizer": type(self.optimizer).__name__ if self.optimizer else None}
        if self.optimizer is not None:
            try:
                meta["lr"] = [float(g.get("lr", float("nan"))) for g in self.optimizer.param_groups]
            except Exception:  # noqa: BLE001 - a custom optimizer without param_groups
                pass
        return Trace(events=events, layers=self.layers(), family=self.family,
                     first_step=self._first_step or 0, last_step=self._last_step,
                     loss=self._loss.summary(), rank=self.rank, world_size=self.world_size,
                     meta=tuple(sorted((k, v if not isinstance(v, list) else tuple(v)) for k, v in meta.items())))

    def export_aquarium_package(self, path) -> str:
        """Write the session as one versioned JSON document (atomically); returns the path."""
        from neuraldbg.session import export_trace

        return export_trace(self.trace(), path, config=self.config.to_dict(), priors=self.priors_path)

    def __repr__(self) -> str:
        return (f"NeuralDbg(family={self.family!r}, every={self.every}, modules={len(self._modules)}, "
                f"step={self._step}, events={len(self._log)})")


# ---- helpers --------------------------------------------------------------------------

def _resolve_family(root: nn.Module, family: str | None) -> str:
    from neuraldbg.priors import FAMILIES, detect_family

    if family is None:
        return detect_family(root)
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    return family


def _guard_compiled_hooks() -> None:
    """Make torch.compile guard on module hooks.

    By default dynamo does not guard on hooks, so a graph traced before our hooks existed (an
    earlier instance of the same class, say) is reused for the monitored module and every
    hook is silently skipped. The first monitor in a process that already loaded dynamo turns
    the hook guards on and drops the compiled graphs once (they recompile on next call, now
    guarded); later monitors find the guards on and do nothing. Without dynamo loaded there is
    nothing stale, and importing it would cost a second.
    """
    if "torch._dynamo" not in sys.modules:
        return
    try:
        dynamo = sys.modules["torch._dynamo"]
        if getattr(dynamo.config, "skip_nnmodule_hook_guards", False):
            dynamo.config.skip_nnmodule_hook_guards = False
            dynamo.reset()
            log.info("neuraldbg: turned on torch.compile hook guards and cleared compiled graphs once, "
                     "so graphs traced without the monitor's hooks are not reused")
    except Exception:  # noqa: BLE001 - a torch without this switch has no such cache issue
        pass


def _compiling() -> bool:
    try:
        return bool(torch.compiler.is_compiling())
    except Exception:  # noqa: BLE001 - old torch
        return False


def _dist_rank() -> tuple[int | None, int | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001
        pass
    return None, None


def _tensors(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _first_tensor(output) -> torch.Tensor | None:
    """A module's main output: the tensor itself, or the first element of a tuple/list
    (LSTM, GRU and MultiheadAttention return (output, state))."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _describe(output) -> str:
    if isinstance(output, torch.Tensor):
        return f"tensor dtype={output.dtype} layout={output.layout}"
    return type(output).__name__


def _concat(tensors: list[torch.Tensor]):
    """One flat float32 tensor (on the first tensor's device) from many small ones."""
    if not tensors:
        return None
    dev = tensors[0].device
    parts = [t.reshape(-1).float() if t.device == dev else t.reshape(-1).float().to(dev) for t in tensors]
    return torch.cat(parts)


def _to_stepstats(step, layout, host, loss, has_bwd) -> StepStats:
    st = StepStats(step=step, loss=loss, has_backward=has_bwd)
    i = 0
    fracs: dict[tuple[str, str], list[float]] = {}
    for group, name, fields, n in layout:
        vals = host[i:i + len(fields)]
        i += len(fields)
        if group == "scale":
            st.grad_scale = vals[0]
            continue
        if group == "input":
            d = st.inputs if st.inputs is not None else {"sum": 0.0, "sumsq": 0.0, "nan": 0.0, "inf": 0.0, "n": 0.0}
            for f, v in zip(fields, vals):
                d[f] += v
            d["n"] += n
            st.inputs = d
            continue
        d = st.layers.setdefault(name, {})
        prefix = {"out": "out_", "gout": "gout_", "pgrad": "pgrad_"}[group]
        for f, v in zip(fields, vals):
            if f.endswith("_frac"):
                fracs.setdefault((name, f), []).append(v)  # a shared module: average its calls
            else:
                d[prefix + f] = d.get(prefix + f, 0.0) + v
        d[prefix + "n"] = d.get(prefix + "n", 0) + n
    for (name, f), vs in fracs.items():
        st.layers[name][f] = sum(vs) / len(vs)
    return st


def _with_rank(ev: Event, rank: int) -> Event:
    import dataclasses

    return dataclasses.replace(ev, rank=rank)
