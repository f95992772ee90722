"""The training monitor: ``with NeuralDbg(model) as dbg:`` around an unchanged loop.

:class:`NeuralDbg` is the façade. It owns three parts, each with its own module:
:class:`~neuraldbg.monitor.hooks.ModuleHooks` (hooks that observe the model and fill a
per-step buffer of device-side statistics), :class:`~neuraldbg.monitor.transfer.HostTransfer`
(each closed step packed into one tensor, moved to the host every ``sync_every`` checked
steps) and the detectors, which turn the host-side numbers into events. The results
(events, trace, export) and the causal queries are read from here.
"""
from __future__ import annotations

import dataclasses
import logging
from functools import partial
from typing import Any, Iterable

import torch
from torch import nn

from neuraldbg.causal.priors import as_priors
from neuraldbg.config import DetectorConfig
from neuraldbg.events.base import Event
from neuraldbg.events.compress import EventLog, Propagation, compress
from neuraldbg.events.registry import DetectorContext, build_detectors
from neuraldbg.events.stepstats import StepStats
from neuraldbg.monitor.addons import Addon, dist_rank
from neuraldbg.monitor.autosave import Autosave
from neuraldbg.monitor.lossinput import loss_value
from neuraldbg.monitor.family import detect_family
from neuraldbg.monitor.history import LossHistory
from neuraldbg.monitor.hooks import ModuleHooks
from neuraldbg.monitor.records import unwrap
from neuraldbg.monitor.probes import Witnesses, config_init_range, last_out_features, reference_stds
from neuraldbg.monitor.reference import DEFAULT_EVERY, ReferenceLoss, check_reference
from neuraldbg.monitor.tokens import TokenWatch, embeddings
from neuraldbg.monitor.transfer import HostTransfer
from neuraldbg.queries import CausalQueries
from neuraldbg.trace import LayerInfo, Trace
from neuraldbg.vocab import validate_family

log = logging.getLogger("neuraldbg")

#: checked steps between two walks of the model for added or swapped modules
MODULE_CHECK_EVERY = 16


class NeuralDbg(CausalQueries):
    """Watch a training loop and explain what went wrong.

    Args:
        model: the module being trained (``torch.compile``, ``DataParallel`` and DDP
            wrappers are looked through; hooks go on the user's modules).
        family: architecture family for priors (``mlp``, ``cnn``, ``transformer``, ``gan``,
            ``lora``, ``diffusion``, ``rnn``, ``gnn``, ``rl``); guessed from module types when None.
        optimizer: optional optimizer. Its step pre/post hooks measure the update-to-weight
            ratio (the learning rate's signature; the weight matrices are copied on the first
            16 checked steps only) and its learning rates go into the export.
        every: check every Nth step (1 = every step).
        config: detector thresholds (:class:`DetectorConfig` or a dict of its fields).
        detectors: names of registered detectors to run (all by default).
        priors: path of a tuned prior file, or a ``Priors`` (default: the family's shipped
            priors); read and validated here, so a bad file fails now, not at the first query.
        output_grads: also record gradients w.r.t. module outputs (eager mode only; off by
            default: no built-in detector reads them, and they cost a hook per output).
        sync_every: checked steps batched per host transfer (default 16: queries flush first).
        scaler: the ``torch.amp.GradScaler`` of a mixed-precision loop, if any. Gradient
            statistics are then divided by the scale in force during backward, and steps whose
            gradients the scaler finds non-finite (it skips them) are not failures unless they
            recur (see ``docs/idioms.md``).
        autosave: path the session is written to (atomically) while the run goes on: on entry,
            on checked steps at most every ``autosave_interval`` seconds (0: every checked
            step) and on exit, so a killed run keeps its diagnosis. Off (``None``) by default.
        snapshots: ``True`` or a ring size ``K`` keeps bounded CPU checkpoints for
            :meth:`verify` (``docs/verification.md``); off (``None``) by default.
        reference: ``fn(model) -> loss`` on a fixed held-out batch of a task the model must
            keep (a fine-tune's pre-training task), called on entry and every
            ``reference_every`` steps without touching training: the retention signature
            (``neuraldbg/monitor/reference.py``). Off (``None``) by default.
    """

    def __init__(self, model: nn.Module, family: str | None = None, optimizer: Any = None, every: int = 1, *,
                 config: DetectorConfig | dict | None = None, detectors: Iterable[str] | None = None,
                 priors: Any = None, output_grads: bool = False, sync_every: int | None = None,
                 scaler: Any = None, snapshots: bool | int | None = None, autosave: Any = None,
                 autosave_interval: float = 30.0, reference: Any = None, reference_every: int = DEFAULT_EVERY) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"NeuralDbg expects a torch.nn.Module, got {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        config = DetectorConfig() if config is None else DetectorConfig.from_dict(config) if isinstance(config, dict) \
            else config
        if not isinstance(config, DetectorConfig):
            raise TypeError(f"config must be a DetectorConfig or dict, got {type(config).__name__}")
        self.reference, self.reference_every = check_reference(reference, reference_every)
        self.model = model
        self.root = unwrap(model)
        self.family = detect_family(self.root) if family is None else validate_family(family)
        self.optimizer = optimizer
        self.every = every
        self.config = config
        self._priors = as_priors(priors, self.family)
        self.priors_path = str(priors) if priors is not None and priors is not self._priors else None
        self.output_grads = output_grads
        if scaler is not None and not (hasattr(scaler, "scale") and hasattr(scaler, "get_scale")):
            raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        self.scaler = scaler
        self._consumed = 0
        self._detector_names = None if detectors is None else list(detectors)
        # batched on the CPU too: reading 16 steps in a row keeps the host code's caches warm
        sync_every = sync_every if sync_every is not None else 16
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self._hooks = ModuleHooks(self.root, every=every, config=config, output_grads=output_grads,
                                  scaler=scaler, report=self._report)
        self._transfer = HostTransfer(sync_every, self._consume)
        self._order, self._order_pos = self._hooks.order, self._hooks.order_pos  # forward order, kept by the hooks
        self._reported: set[tuple] = set()
        self._step = 0
        self._user_steps = False
        self._detectors = None
        self._log = EventLog(gap=config.collapse_gap_checks * every, layer_index=self._layer_index)
        self._loss = LossHistory()
        self._first_step: int | None = None
        self._last_step = 0
        self._entered = self._exited = False
        self._witnesses = Witnesses()  # the root causes' signatures (probes.py)
        self._closed_active = False  # whether the step closed last was a checked one
        self.rank, self.world_size = dist_rank()
        self._addons: list[Addon] = []  # optional parts with a lifecycle (monitor/addons.py)
        if snapshots:  # checkpoints for verify(); the reference init scales serve its re-initialization
            from neuraldbg.verify.snapshots import make_snapshots
            self._addons.append(make_snapshots(snapshots, partial(reference_stds, init_range=config_init_range(model))))
        if embeddings(self.root):  # token models' input shift (monitor/tokens.py)
            self._addons.append(TokenWatch())
        if autosave is not None:  # the session on disk while training runs (monitor/autosave.py)
            self._addons.append(Autosave(autosave, autosave_interval))
        if reference is not None:  # what a fine-tune must keep (monitor/reference.py)
            self._addons.append(ReferenceLoss(reference, reference_every))

    @property
    def sync_every(self) -> int:
        """Checked steps batched per host transfer."""
        return self._transfer.sync_every

    @sync_every.setter
    def sync_every(self, value: int) -> None:
        self._transfer.sync_every = value

    # ---- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> "NeuralDbg":
        if self._entered:
            raise RuntimeError(f"this NeuralDbg is already {'used' if self._exited else 'active'}; "
                               "create a new one per run")
        self._entered = True
        try:
            self._hooks.register(entries=not hasattr(self.model, "_orig_mod"))  # compiled: its root is the entry
        except Exception:  # never break training: a monitor that cannot hook degrades to nothing
            self._hooks.remove()
            log.exception("neuraldbg: could not register hooks; monitoring is off for this run")
            return self
        self._safe(lambda: self._witnesses.measure(self._hooks.modules, self.root), "initial weight scale")
        self._safe(lambda: self._witnesses.attach(self.optimizer, self._hooks.modules, self._update_checked,
                                                  self._report), "step size")
        self._call_addons("enter")
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._exited = True
        self._hooks.remove()
        self._safe(self._witnesses.remove, "step size")
        self._safe(self._close_step, "close")
        self._safe(self._transfer.drain, "drain")
        self._call_addons("exit", exc)
        return False

    # ---- root-cause signatures (docs/causal_model.md) ------------------------------------
    def _update_checked(self) -> bool:
        """Whether the optimizer step now starting belongs to a checked step. Without
        ``dbg.step``, ``record_loss`` has already closed that step (and opened the next)."""
        return bool(self._hooks.handles) and (self._hooks.buf.active if self._user_steps else self._closed_active)

    def signatures(self) -> dict[str, float]:
        """The measured root-cause signatures (one host transfer): weight scale at the start
        (``init_scale_log10``), low-rank adapters' starting ``||B A|| / ||W||``
        (``adapter_ratio``), update-to-weight ratios over the first checked steps read at the
        peak learning rate (``step_ratio_peak``: the median layer, ``step_ratio_max``: the
        fastest; see :class:`~neuraldbg.monitor.probes.StepSizeProbe`), the peak learning rate
        as set, the model's output size (``out_features``) and the add-ons' (``reference_*``)."""
        out = self._witnesses.summary()
        for addon in self._addons:  # duck-typed add-ons need not define every method
            out.update(getattr(addon, "signatures", dict)())
        k = last_out_features(self._order, dict(self._hooks.modules))
        if k is not None:
            out["out_features"] = k
        return out

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
        self._hooks.start_step(value)
        if self._addons:
            self._call_addons("step_started", value, self._hooks.buf.active)

    def record_loss(self, loss: float | torch.Tensor) -> None:
        """Record this step's loss: any real scalar (Python or numpy number, one-element array
        or tensor of a real dtype; no device sync). Complex or non-numeric values raise
        ``TypeError``, a call after the ``with`` block ``RuntimeError``.

        Several calls in one step (set with ``dbg.step``) are averaged. Without ``dbg.step``
        each call ends the step and advances it.
        """
        if self._exited:
            raise RuntimeError("record_loss called after the with block exited; create a new NeuralDbg per run")
        self._hooks.add_loss(loss_value(loss))
        if not self._user_steps:
            self._safe(self._close_step, "close")
            self._start_step(self._step + 1)

    def _close_step(self) -> None:
        self._closed_active = self._hooks.buf.active
        buf = self._hooks.take()
        if buf is None:
            return
        self._transfer.push(buf)  # O(1): the hooks keep the forward order as they fire
        if self._addons:
            self._call_addons("step_closed", buf.step, buf.active)

    # ---- detectors ---------------------------------------------------------------------
    def _consume(self, st: StepStats) -> None:
        self._consumed += bool(st.names)  # checked steps only: a loss-only step saw no module
        if st.names and self._consumed % MODULE_CHECK_EVERY == 1:
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
                    self._add_event(ev)
            except Exception as e:  # noqa: BLE001
                self._report((det.name, type(e).__name__), f"detector {det.name} failed: {e!r}")

    def _add_event(self, ev: Event) -> None:
        self._log.add(ev if self.rank is None else dataclasses.replace(ev, rank=self.rank))

    def _check_modules(self) -> None:
        """Follow modules added or swapped in mid-run; detectors forget the replaced layers,
        whose baselines described the old weights."""
        replaced = self._hooks.check_modules()
        if replaced is None:
            return
        for det in self._detectors or ():
            for name in replaced:
                det.forget_layer(name)
        if self._detectors is not None:
            ctx = self._context()  # new layer names join the forward order detectors read
            for det in self._detectors:
                det.context = ctx

    def _layer_index(self, name: str | None) -> int | None:
        return None if name is None else self._order_pos.get(name)

    def _context(self) -> DetectorContext:
        order = tuple(self._order)
        return DetectorContext(family=self.family, layer_order=order,
                               layer_kinds=tuple(sorted(self._hooks.kinds.items())),
                               input_layer=order[0] if order else None)

    def _safe(self, fn, what: str) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            self._report(("internal", what, type(e).__name__), f"internal error in {what}: {e!r}")

    def _call_addons(self, what: str, *args) -> None:
        for addon in (a for a in self._addons if hasattr(a, what)):  # duck-typed ones may lack some
            self._safe(lambda: getattr(addon, what)(self, *args), f"{type(addon).__name__}.{what}")

    def _report(self, key: tuple, msg: str, level: int = logging.WARNING) -> None:
        if key not in self._reported:
            self._reported.add(key)
            log.log(level, "neuraldbg: %s", msg)

    def _flush(self) -> None:
        """Process everything recorded so far (queries call this; training is unaffected)."""
        self._safe(self._close_step, "close")
        self._safe(self._transfer.drain, "drain")
        self._call_addons("flush")
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
        modules = self._hooks.modules
        names = list(self._order) + [n for n, _ in modules if n not in self._order_pos]
        mods = dict(modules)
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
        try:
            meta.update(self.signatures())
        except Exception as e:  # noqa: BLE001 - the diagnosis then runs without signatures
            self._report(("internal", "signatures", type(e).__name__), f"internal error in signatures: {e!r}")
        return Trace(events=events, layers=self.layers(), family=self.family,
                     first_step=self._first_step or 0, last_step=self._last_step,
                     loss=self._loss.summary(), rank=self.rank, world_size=self.world_size,
                     meta=tuple(sorted((k, v if not isinstance(v, list) else tuple(v)) for k, v in meta.items())))

    def reference_points(self) -> list[tuple[int, float]]:
        """``(step, reference loss)`` recorded so far (``reference=``; empty without one)."""
        ref = next((a for a in self._addons if isinstance(a, ReferenceLoss)), None)
        return ref.points() if ref is not None else []

    def export_aquarium_package(self, path) -> str:
        """Write the session as one versioned JSON document (atomically); returns the path."""
        from neuraldbg.session import export_trace

        return export_trace(self.trace(), path, config=self.config.to_dict(), priors=self.priors)

    def verify(self, replay, steps: int = 20, top: int = 3):
        """Replay each top hypothesis' window with its fix; a ``Verification`` (docs/verification.md)."""
        from neuraldbg.verify.api import verify
        return verify(self, replay, steps=steps, top=top)

    @property
    def snapshot_bytes(self) -> int:
        """CPU bytes held by the snapshots (0 when ``snapshots`` is off)."""
        from neuraldbg.verify.api import snapshot_bytes
        return snapshot_bytes(self)

    def __repr__(self) -> str:
        return (f"NeuralDbg(family={self.family!r}, every={self.every}, modules={len(self._hooks.modules)}, "
                f"step={self._step}, events={len(self._log)})")
