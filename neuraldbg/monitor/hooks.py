"""The monitor's hooks: registration, the callbacks, the per-step buffer they fill, module swaps.

Hooks observe, they never patch ``forward``. Each callback computes a few reductions on the
device under ``torch.no_grad()`` (:mod:`neuraldbg.monitor.stats`) and appends the result to
the current :class:`_StepBuffer`; nothing is moved to the host per hook. A callback never
raises into training: a failure is reported once and, for a module's output, disables that
module's statistics.
"""
from __future__ import annotations

import logging
import sys
import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from neuraldbg.config import DetectorConfig
from neuraldbg.monitor import stats as S

log = logging.getLogger("neuraldbg")


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


class ModuleHooks:
    """The hooks on one model and the step buffer they fill.

    Lifecycle: :meth:`register` when the monitor is entered, :meth:`remove` when it exits.
    In between the owner frames steps with :meth:`start_step` and :meth:`take`, and calls
    :meth:`check_modules` now and then to follow modules added or swapped in mid-run.
    ``report(key, msg, level)`` logs a problem once per key.
    """

    def __init__(self, root: nn.Module, *, every: int, config: DetectorConfig, output_grads: bool,
                 scaler: Any, report: Callable[..., None]) -> None:
        self.root = root
        self.every = every
        self.config = config
        self.output_grads = output_grads
        self.scaler = scaler
        self._report = report
        self.eval_trains = False  # set when the model is trained in eval() mode (then eval forwards count)
        # layer name -> (weak ref to the hooked module, its hook handles, ids of its params):
        # how replaced or renamed modules are noticed and unhooked (weak: an orphan is freed)
        self.hooked: dict[str, tuple[Any, list, list[int]]] = {}
        self.hooked_params: set[int] = set()
        self.handles: list[Any] = []
        self.modules = monitored_modules(root)
        self.kinds = {name: S.activation_kind(m) for name, m in self.modules}
        self.disabled: set[str] = set()
        self.buf = _StepBuffer(0, True)

    # ---- lifecycle -------------------------------------------------------------------
    def register(self) -> None:
        """Hook the model input and every monitored module (raises if torch refuses a hook)."""
        _guard_compiled_hooks()
        self.handles.append(self.root.register_forward_pre_hook(self._on_input, with_kwargs=True))
        self._hook_modules(self.modules)

    def remove(self) -> None:
        """Remove every hook handle registered so far (safe to call twice)."""
        for h in self.handles:
            try:
                h.remove()
            except Exception:  # pragma: no cover - removal of a dead handle is harmless
                pass
        self.handles.clear()

    def start_step(self, step: int) -> None:
        """Start recording ``step`` (measured only when it is a multiple of ``every``)."""
        self.buf = _StepBuffer(step, step % self.every == 0)

    def take(self) -> _StepBuffer | None:
        """The current step's buffer if anything was recorded (None otherwise).

        Hooks that fire later in the same step fill a fresh buffer of that step.
        """
        buf = self.buf
        if buf.empty():
            return None
        self.buf = _StepBuffer(buf.step, buf.active)
        return buf

    def _hook_modules(self, modules: list[tuple[str, nn.Module]]) -> None:
        owner: dict[int, tuple[str, nn.Parameter]] = {}
        for name, mod in modules:
            kind = self.kinds[name]
            h = mod.register_forward_hook(partial(self._on_output, name, kind, S.bounds_of(mod),
                                                  getattr(mod, "dim", None)))
            self.handles.append(h)
            self.hooked[name] = (weakref.ref(mod), [h], [])
            for p in mod.parameters(recurse=False):
                if p.requires_grad and id(p) not in owner and id(p) not in self.hooked_params:
                    owner[id(p)] = (name, p)
        for name, p in owner.values():
            h = p.register_post_accumulate_grad_hook(partial(self._on_param_grad, name))
            self.handles.append(h)
            self.hooked[name][1].append(h)
            self.hooked[name][2].append(id(p))
            self.hooked_params.add(id(p))

    def check_modules(self) -> list[str] | None:
        """Hook modules added or swapped in since the last check (log once per layer name).

        Returns the names of the layers that got a new module (the owner's detectors must
        forget what they learned about them), or None when the model is unchanged or the
        hooks are not active. A replaced layer keeps its name but gets a new module; its old
        hooks stay on the orphan until :meth:`remove`.
        """
        if not self.handles:
            return None  # not active (or registration failed): nothing to keep in sync
        current = monitored_modules(self.root)
        now = dict(current)
        stale = [n for n, (ref, _, _) in self.hooked.items() if now.get(n) is None or ref() is not now[n]]
        new = [(n, m) for n, m in current if n not in self.hooked or self.hooked[n][0]() is not m]
        if not new and not stale:
            return None
        for name in stale:
            # the module left the model or moved under another name (e.g. wrapped by an
            # adapter): its hooks would report under a wrong or dead name
            _, handles, pids = self.hooked.pop(name)
            for h in handles:
                h.remove()
            self.hooked_params.difference_update(pids)
        for name, mod in new:
            self.kinds[name] = S.activation_kind(mod)
            self._report(("replaced", name), f"module {name} was added or replaced during training "
                         f"(now {type(mod).__name__}); monitoring the new module", level=logging.INFO)
        self.modules = current
        self._hook_modules(new)
        return [name for name, _ in new]

    # ---- callbacks ---------------------------------------------------------------------
    def _skip_forward(self, buf: _StepBuffer) -> bool:
        # validation passes (no_grad, or eval() mode) must not mix into training statistics;
        # a model that is trained in eval() mode is noticed at its first backward (see below)
        if not buf.active or not torch.is_grad_enabled():
            return True
        if not self.root.training and not self.eval_trains:
            buf.eval_skipped = True
            return True
        return False

    def _on_input(self, module, args, kwargs):
        buf = self.buf
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
        buf = self.buf
        if name in self.disabled or self._skip_forward(buf):
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
            self.disabled.add(name)
            self._report((name, type(e).__name__), f"statistics of {name} failed and are disabled: {e!r}")
        return None

    def _on_out_grad(self, name, buf, n, grad):
        try:
            if buf is self.buf and buf.active and grad is not None:
                with torch.no_grad():
                    buf.gout.append((name, n, S.grad_stats(grad, self._inv_scale(buf))))
        except Exception as e:  # noqa: BLE001
            self._report((name, "gout", type(e).__name__), f"output-gradient statistics failed: {e!r}")
        return None

    def _on_param_grad(self, name, param):
        buf = self.buf
        try:
            if buf.active and param.grad is not None:
                if buf.eval_skipped and not buf.fwd and not self.eval_trains:
                    # a backward after eval()-mode forwards: this model trains in eval mode
                    self.eval_trains = True
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


# ---- helpers --------------------------------------------------------------------------

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
