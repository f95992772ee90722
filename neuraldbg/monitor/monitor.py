"""The training monitor: ``with NeuralDbg(model) as dbg:`` around an unchanged loop.

:class:`NeuralDbg` is the façade. It owns :class:`~neuraldbg.monitor.hooks.ModuleHooks` (hooks
that observe the model and fill a per-step buffer of device-side statistics),
:class:`~neuraldbg.monitor.transfer.HostTransfer` (each closed step packed into one tensor, moved
to the host every ``sync_every`` checked steps), the detectors, which turn the host-side numbers
into events, and its *parts* (``neuraldbg/lifecycle.py``): the measurements behind the root
causes' signatures and the optional add-ons, each told the monitor's lifecycle through a
:class:`~neuraldbg.monitor.context.PartContext`. The results (events, trace, export) and the
causal queries are read from here: their code is the two halves it inherits,
:class:`~neuraldbg.monitor.feed.EventFeed` (each transferred step fed to the detectors) and
:class:`~neuraldbg.monitor.results.MonitorResults` (what is read back).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Iterable

import torch
from torch import nn

from neuraldbg.causal.priors import as_priors
from neuraldbg.config import DetectorConfig
from neuraldbg.monitor.cadence import AUTO, DEFAULT_OVERHEAD, AutoSchedule, check_overhead, schedule_for
from neuraldbg.monitor.context import PartContext, Parts
from neuraldbg.monitor.family import detect_family
from neuraldbg.monitor.feed import EventFeed
from neuraldbg.monitor.hooks import ModuleHooks
from neuraldbg.monitor.livemerge import DEFAULT_MERGE_TIMEOUT, LiveMerge
from neuraldbg.monitor.lossinput import is_cross_entropy, loss_value
from neuraldbg.monitor.measurements import parts_for
from neuraldbg.monitor.measurements.reference import check_reference
from neuraldbg.monitor.measurements.weights import weight_census
from neuraldbg.monitor.optimizers import OptimizerWatch
from neuraldbg.monitor.records import DATA_PARALLEL, dist_rank, unwrap, wrappers
from neuraldbg.monitor.results import MonitorResults
from neuraldbg.monitor.roles import LayerRoles
from neuraldbg.monitor.settings import (DEFAULT_REFERENCE_EVERY, Settings, check_at_init, check_config,
                                        check_detectors, check_every, check_merge_timeout, check_resume,
                                        check_scaler, check_sync_every)
from neuraldbg.monitor.transfer import HostTransfer
from neuraldbg.trace import CadenceRecord, Trace
from neuraldbg.vocab import validate_family

log = logging.getLogger("neuraldbg")

_NEG_INF = -math.inf


class NeuralDbg(MonitorResults, EventFeed):
    """Watch a training loop and explain what went wrong.

    Args:
        model: the module being trained (``torch.compile``, ``DataParallel`` and DDP
            wrappers are looked through; hooks go on the user's modules).
        family: architecture family for priors (``mlp``, ``cnn``, ``transformer``, ``gan``,
            ``lora``, ``diffusion``, ``rnn``, ``gnn``, ``rl``); guessed from module types when None.
        optimizer: the primary optimizer, optional. Without it the monitor finds the optimizers
            that step the model's parameters (torch's global optimizer step hooks); the primary
            one's steps measure the update-to-weight ratio (the learning rate's signature; the
            weight matrices are copied on the first 16 checked steps only), and its learning
            rates go into the export.
        every: which steps are checked (measured; the loss is recorded on every step).
            ``"auto"`` (default): every step of the first 32, then an interval the monitor
            chooses on the run itself so that the checks add at most ``overhead`` to the mean
            step time, re-estimated as the run goes, and every step again for a while after an
            anomaly (a non-finite or spiking loss, an acute event); ``dbg.cadence`` records
            what it chose (``neuraldbg/monitor/cadence.py``). An int ``N``: every Nth step,
            fixed (``every=1``, every step, is the debugging form).
        overhead: the budget ``every="auto"`` holds, a share of the mean step time in (0, 1)
            (default 0.03: 3 %). Accepted with an int ``every`` too, where it is not used.
        config: detector thresholds (:class:`DetectorConfig` or a dict of its fields).
        detectors: names of registered detectors to run (all by default).
        priors: path of a tuned prior file, or a ``Priors`` (default: the family's shipped
            priors); read and validated here, so a bad file fails now, not at the first query.
        sync_every: checked steps batched per host transfer (default 16: queries flush first).
        scaler: the ``torch.amp.GradScaler`` of a mixed-precision loop, if any. Gradient
            statistics are then divided by the scale in force during backward, and steps whose
            gradients the scaler finds non-finite (it skips them) are not failures unless they
            recur (see ``docs/idioms.md``).
        snapshots: ``True`` or a ring size ``K`` keeps bounded CPU checkpoints for
            :meth:`verify` (``docs/verification.md``); off (``None``) by default.
        autosave: path the session is written to (atomically) while the run goes on: on entry,
            on checked steps at most every ``autosave_interval`` seconds (0: every checked
            step) and on exit, so a killed run keeps its diagnosis. Off (``None``) by default.
        reference: ``fn(model) -> loss`` on a fixed held-out batch of a task the model must
            keep (a fine-tune's pre-training task), called on entry and every
            ``reference_every`` steps without touching training: the retention signature
            (``neuraldbg/monitor/measurements/reference.py``). Off (``None``) by default.
        at_init: whether the weights on entry are an initialization. ``False`` for a resumed,
            loaded or pre-trained model (their scale is then no evidence about the
            initialization); ``None`` (default) decides from the run: an optimizer that already
            holds state before its first step means a resume.
        merge_timeout: under ``torch.distributed`` (initialized before the monitor, several
            ranks), rank 0 waits at most this many seconds at exit for the other ranks' traces,
            then answers its queries for the whole job (:attr:`merged_trace`; a rank that sent
            none is named unobserved, ``docs/distributed.md``). 0 turns the live merge off.
        resume: the earlier part of a run resumed from a checkpoint: its session document
            (:meth:`session_dict`, ``trace_to_dict``), ``Session`` or ``Trace``. This monitor
            then continues its evidence: :meth:`trace`, the queries and the export answer for
            the whole run (``neuraldbg.distributed.concat_traces``): the earlier part's events,
            loss history and entry signatures (its initialization, when it started at one) with
            this part's. ``None`` (default): the monitor sees the run from its start.

    ``dbg.settings`` holds all of them, validated, as one frozen record.
    """

    def __init__(self, model: nn.Module, family: str | None = None, optimizer: Any = None, every: int | str = AUTO, *,
                 config: DetectorConfig | dict | None = None, detectors: Iterable[str] | None = None,
                 priors: Any = None, sync_every: int | None = None, scaler: Any = None,
                 snapshots: bool | int | None = None, autosave: Any = None, autosave_interval: float = 30.0,
                 reference: Any = None, reference_every: int = DEFAULT_REFERENCE_EVERY,
                 at_init: bool | str | None = None, merge_timeout: float = DEFAULT_MERGE_TIMEOUT,
                 resume: Any = None, overhead: float = DEFAULT_OVERHEAD) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"NeuralDbg expects a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.root = unwrap(model)
        family = detect_family(self.root) if family is None else validate_family(family)
        reference, reference_every = check_reference(reference, reference_every)
        pri = as_priors(priors, family)
        self.priors_path = str(priors) if priors is not None and priors is not pri else None
        self.settings = Settings(
            family=family, optimizer=optimizer, every=check_every(every), config=check_config(config),
            detectors=check_detectors(detectors), priors=pri, sync_every=check_sync_every(sync_every),
            scaler=check_scaler(scaler), snapshots=snapshots, autosave=autosave,
            autosave_interval=autosave_interval, reference=reference, reference_every=reference_every,
            at_init=check_at_init(at_init), merge_timeout=check_merge_timeout(merge_timeout),
            resume=check_resume(resume, family), overhead=check_overhead(overhead))
        self._priors = pri
        #: the checked steps' decisions, one per step as it starts (cadence.py)
        self._cadence = schedule_for(self.settings.every, self.settings.overhead, busy=self._transfer_seconds)
        self._auto = isinstance(self._cadence, AutoSchedule)
        self._hooks = ModuleHooks(self.root, schedule=self._cadence, config=self.config, scaler=self.scaler,
                                  report=self._report, backward_started=self._backward_started,
                                  fail=self._failed)
        self._transfer = HostTransfer(self.settings.sync_every, self._consume)
        self._order_pos = self._hooks.order_pos  # forward order, kept by the hooks
        self._reported: set[tuple] = set()
        self._internal_errors = 0
        self._step = 0
        self._init_feed()
        self._user_steps = False
        self._entered = self._exited = False
        self._census: list = []  # the weight matrices and their norms on entry
        self._roles: LayerRoles | None = None  # attention q/k and normalization layers
        self._first_loss_seen = False
        self._loss_is_ce: bool | None = None  # whether the first recorded loss is a cross-entropy
        self._closed_active = False  # whether the step closed last was a checked one
        self.rank, self.world_size = dist_rank()
        self._live: LiveMerge | None = None
        self._merged: Trace | None = None  # the job's trace, on rank 0 after the live merge
        self._optimizers = OptimizerWatch(self.root, optimizer, self._optimizer_pre, self._optimizer_post)
        self._parts = Parts(parts_for(self.root, self.settings), PartContext(self), self._fail)

    # ---- the settings, read-only -------------------------------------------------------
    family = property(lambda self: self.settings.family, doc="Architecture family used for priors.")
    optimizer = property(lambda self: self._optimizers.primary,
                         doc="The primary optimizer: the one given, else the first found stepping the model.")
    every = property(lambda self: self.settings.every,
                     doc='The cadence setting: an int N (every Nth step is checked) or "auto".')
    overhead = property(lambda self: self.settings.overhead, doc='The overhead budget of every="auto".')
    config = property(lambda self: self.settings.config, doc="The detector thresholds.")
    scaler = property(lambda self: self.settings.scaler, doc="The GradScaler of a mixed-precision loop.")
    reference = property(lambda self: self.settings.reference, doc="The reference-loss function, if any.")
    reference_every = property(lambda self: self.settings.reference_every, doc="Steps between reference losses.")

    @property
    def sync_every(self) -> int:
        """Checked steps batched per host transfer."""
        return self._transfer.sync_every

    @sync_every.setter
    def sync_every(self, value: int) -> None:
        self._transfer.sync_every = check_sync_every(value)

    @property
    def interval(self) -> int:
        """The check interval in force now (``every`` itself at a fixed interval; under
        ``every="auto"`` the one chosen, 1 during a dense window)."""
        return self._cadence.interval_now(self._step)

    @property
    def checks(self) -> int:
        """How many steps were checked so far (the monitor's first buffer, step 0, included)."""
        return self._cadence.checks

    @property
    def cadence(self) -> CadenceRecord:
        """Which steps were checked so far: the setting, the budget, the interval from each step
        on and the anomalies that made an ``"auto"`` cadence dense again (the session keeps it)."""
        return self._cadence.record()

    def addon(self, cls: type) -> Any:
        """This monitor's part of type ``cls`` (a measurement or an add-on), or ``None``."""
        return self._parts.of_type(cls)

    # ---- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> "NeuralDbg":
        if self._entered:
            raise RuntimeError(f"this NeuralDbg is already {'used' if self._exited else 'active'}; "
                               "create a new one per run")
        self._entered = True
        try:
            # compiled: its root is the entry
            self._hooks.register(entries=not hasattr(self.model, "_orig_mod"), parallel=self._data_parallel())
        except Exception:  # never break training: a monitor that cannot hook degrades to nothing
            self._hooks.remove()
            log.exception("neuraldbg: could not register hooks; monitoring is off for this run")
            return self
        self._safe(self._measure_weights, "weight census")
        self._safe(self._start_roles, "layer roles")
        self._safe(lambda: self._optimizers.start(self._report), "optimizer hooks")
        self._parts.call("enter")
        self._live = LiveMerge.start(self.rank, self.world_size, self.settings.merge_timeout, self.settings.autosave)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._exited = True
        self._hooks.remove()
        if self._roles is not None:
            self._roles.remove()
        self._safe(self._optimizers.stop, "optimizer hooks")
        self._safe(self._close_step, "close")
        self._safe(self._transfer.drain, "drain")
        self._parts.call("exit", exc)
        if self._live is not None:  # after the parts: the trace sent is the final one
            live, self._live = self._live, None
            self._safe(lambda: setattr(self, "_merged", live.finish(self.trace())), "live merge")
        return False

    def _data_parallel(self) -> bool:
        """Whether the model trains data-parallel (a wrapper, or ``torch.distributed`` initialized)."""
        return self.rank is not None or any(isinstance(m, DATA_PARALLEL) for m in wrappers(self.model))

    def _start_roles(self) -> None:
        """The layers' roles: by name now, normalization probed on the first forward."""
        self._roles = LayerRoles(self.root, self._hooks.modules)

    def _measure_weights(self) -> None:
        """Every dense weight matrix and its norm, once, before the first update (one host
        transfer): what the initial-scale and step-size measurements start from."""
        self._census = weight_census(self._hooks.modules)

    def _optimizer_pre(self, optimizer: Any) -> None:
        checked = self._update_checked()
        self._hooks.check_output_grads()
        # a checked step s reads the rate noted at step s, else at s + 1 (_consume): only those
        if checked or self._cadence.near_check(self._step):
            self._safe(lambda: self._note_lr(optimizer), "learning rate")
        self._parts.call_step("optimizer_pre", optimizer, checked)

    def _note_lr(self, optimizer: Any) -> None:
        """The primary optimizer's learning rate at this step, for the gradient baselines
        (``neuraldbg/events/gradient.py``); host floats only, a tensor rate is not read."""
        if not self._optimizers.is_primary(optimizer):
            return
        lrs = [float(g["lr"]) for g in optimizer.param_groups if isinstance(g.get("lr"), (int, float))]
        if lrs:
            self._lr_at[self._step] = max(lrs)

    def _optimizer_post(self, optimizer: Any) -> None:
        self._parts.call_step("optimizer_post", optimizer, self._update_checked())

    def _backward_started(self, param: Any) -> None:
        self._parts.call("backward_started", param)

    def _update_checked(self) -> bool:
        """Whether the optimizer step now running belongs to a checked step. Without
        ``dbg.step``, ``record_loss`` has already closed that step (and opened the next)."""
        return bool(self._hooks.handles) and (self._hooks.buf.active if self._user_steps else self._closed_active)

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
        checked = self._cadence.start(value)  # the one decision about this step
        self._quiet_optimizers(value)
        self._hooks.start_step(value, checked)
        self._parts.call_step("step_started", value, checked)

    def record_loss(self, loss: float | torch.Tensor) -> None:
        """Record this step's loss: any real scalar (Python or numpy number, one-element array
        or tensor of a real dtype; no device sync). Complex or non-numeric values raise
        ``TypeError``, a call after the ``with`` block ``RuntimeError``.

        Several calls in one step (set with ``dbg.step``) are averaged. Without ``dbg.step``
        each call ends the step and advances it.
        """
        if self._exited:
            raise RuntimeError("record_loss called after the with block exited; create a new NeuralDbg per run")
        value = loss_value(loss)
        if type(value) is float and not (_NEG_INF < value < self._cadence.spike_above):
            # a non-finite or spiking loss the user already read: the cadence goes dense now (a
            # tensor loss is judged once the transfer has brought it to the host, never synced)
            self._safe(lambda: self._cadence.watch_loss(self._step, value, self._step), "cadence")
        if not self._first_loss_seen:
            # once per run, before the detach: whether the loss can be read against chance level
            self._first_loss_seen = True
            self._safe(lambda: setattr(self, "_loss_is_ce", is_cross_entropy(loss)), "loss kind")
        if self._user_steps:
            self._hooks.add_loss(value)
        elif not self._close_unchecked(value):
            self._hooks.add_loss(value)
            self._safe(self._close_step, "close")
            self._start_step(self._step + 1)

    def _close_unchecked(self, loss: float | torch.Tensor) -> bool:
        """Close an unchecked step, whose only record is ``loss``, when the next step is unchecked
        too, in a few operations: the loss queued with its step, the buffer reset. False (nothing
        done) where the full close and start apply: a checked step on either side, anything else
        recorded, an empty batch, or a part that hears unchecked steps. This runs on nine steps in
        ten at every=10, after the backward pass has pushed the monitor's objects out of the CPU's
        caches: each object made or touched here costs microseconds."""
        hooks = self._hooks
        buf = hooks.buf
        nxt = self._step + 1
        # the schedule decided at the last full start which step it must start next: the next
        # check, or the step two after a check, which times the check's tail (next_start only
        # moves at a full start, or earlier when an anomaly makes the cadence dense)
        if (buf.active or nxt >= self._cadence.next_start or hooks.batch_empty or not buf.blank()
                or self._parts.hears_unchecked_steps):
            return False
        self._closed_active = False
        self._transfer.push_loss(self._step, loss)
        self._step = nxt
        # _quiet_optimizers, inlined: nxt is unchecked and so was this step, so nxt is not the
        # step after a checked one
        self._optimizers.quiet = not self._parts.hears_unchecked_optimizer
        hooks.next_unchecked(nxt)
        return True

    def _quiet_optimizers(self, step: int) -> None:
        """Whether the optimizer hooks return at once during ``step``: an unchecked step that is
        not the one after a checked step (without ``dbg.step``, the optimizer step of a checked
        step runs after ``record_loss`` opened the next one; its rate is noted there too), while no
        part needs them on unchecked steps. ``step`` has started (the schedule decided it)."""
        self._optimizers.quiet = not self._cadence.near_check(step) and not self._parts.hears_unchecked_optimizer

    def _close_step(self) -> None:
        self._closed_active = self._hooks.buf.active
        buf = self._hooks.take()
        if buf is None:
            return
        self._transfer.push(buf)  # O(1): the hooks keep the forward order as they fire
        self._parts.call_step("step_closed", buf.step, buf.active)

    def _transfer_seconds(self) -> float:
        """Host seconds spent in transfers so far (the cadence times them apart)."""
        return self._transfer.seconds

    def _safe(self, fn, what: str) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the monitor never raises into training
            self._fail(what, e)

    def _fail(self, what: str, e: BaseException) -> None:
        """Count a failure inside the monitor and log it once per place and kind."""
        self._internal_errors += 1
        self._report(("internal", what, type(e).__name__), f"internal error in {what}: {e!r}")

    def _failed(self, key: tuple, msg: str) -> None:
        """Count a failure of the monitor's statistics (a hook, a detector) and log it once per key."""
        self._internal_errors += 1
        self._report(key, msg)

    def _report(self, key: tuple, msg: str, level: int = logging.WARNING) -> None:
        if key not in self._reported:
            self._reported.add(key)
            log.log(level, "neuraldbg: %s", msg)

    def _flush(self) -> None:
        """Process everything recorded so far (queries call this; training is unaffected)."""
        self._safe(self._close_step, "close")
        self._safe(self._transfer.drain, "drain")
        self._parts.call("flush")
        if self._detectors is None and self._hooks.order:
            self._build_detectors()

    @property
    def active(self) -> bool:
        """Whether the monitor's hooks are in the model (inside the ``with`` block)."""
        return bool(self._hooks.handles)

    @property
    def snapshot_bytes(self) -> int:
        """CPU bytes held by the snapshots (0 when ``snapshots`` is off)."""
        from neuraldbg.verify.api import snapshot_bytes
        return snapshot_bytes(self)

    def __repr__(self) -> str:
        return (f"NeuralDbg(family={self.family!r}, every={self.every!r}, modules={len(self._hooks.modules)}, "
                f"step={self._step}, events={len(self._log)})")

