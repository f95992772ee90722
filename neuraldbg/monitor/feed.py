"""The host side of a monitor's steps: each transferred step's statistics fed to the detectors,
their events logged.

:class:`EventFeed` is the consuming half of :class:`~neuraldbg.monitor.monitor.NeuralDbg` (which
inherits it): :meth:`EventFeed._consume` is what :class:`~neuraldbg.monitor.transfer.HostTransfer`
calls once per queued step, in step order. It keeps the loss history, the steps seen, the
learning rates noted by the optimizer hooks until their step is read, and walks the model now
and then for modules added or swapped mid-run.
"""
from __future__ import annotations

import dataclasses
from collections import deque

from neuraldbg.events.base import ACTIVATION, Event
from neuraldbg.events.compress import EventLog
from neuraldbg.events.registry import DetectorContext, build_detectors
from neuraldbg.events.stepstats import StepStats
from neuraldbg.monitor.cadence import ALARM_EVENTS
from neuraldbg.monitor.history import LossHistory

#: checked steps between two walks of the model for added or swapped modules
MODULE_CHECK_EVERY = 16


class EventFeed:
    """Mixin: the detectors of a monitor and what they are fed (:meth:`_init_feed` sets the state).
    It reads the monitor's hooks (the forward order, the module walk), optimizers and parts, and
    reports through the monitor's ``_safe`` and ``_failed``."""

    def _init_feed(self) -> None:
        self._consumed = 0      # checked steps read
        self._grad_steps = 0    # of which with parameter gradients
        self._detectors = None  # built at the first step read (the forward order is known then)
        self._loss_readers: list = []
        # hits of one condition within `collapse_gap_checks` checks of each other are one episode:
        # that many intervals (every="auto" starts dense, at 1, and follows its checks: below)
        k = self.config.collapse_gap_checks
        gap = k * self._cadence.entry_interval
        # a rotated model reads each layer's outputs once every `shares` checks: the activation
        # regime of a layer repeats that far apart and is still one episode
        shares = self._hooks.shares
        self._log = EventLog(gap=gap, layer_index=self._layer_index,
                             gaps={ACTIVATION: gap * shares} if shares > 1 else None)
        #: every="auto": the steps of the last checks read, whose spacing is the log's gap
        self._check_steps: deque[int] | None = deque(maxlen=k * shares + 1) if self._auto else None
        self._loss = LossHistory()
        self._first_step: int | None = None
        self._last_step = 0
        self._lr_at: dict[int, float] = {}  # monitor step -> learning rate, until consumed

    def _consume(self, st: StepStats) -> None:
        """One transferred step, in step order: its loss into the history, its rate attached, then
        the detectors (only those reading losses for a step that recorded nothing else)."""
        self._consumed += bool(st.names)  # checked steps only: a loss-only step saw no module
        self._grad_steps += bool(st.names) and bool(st.has_pgrad.any())
        if st.names and self._consumed % MODULE_CHECK_EVERY == 1:
            # a walk of named_modules on the host, so only every few checks: catches layers
            # added or swapped mid-run within MODULE_CHECK_EVERY checked steps
            self._safe(self._check_modules, "module check")
        if self._first_step is None:
            self._first_step = st.step
        self._last_step = max(self._last_step, st.step)
        if st.loss is not None:
            self._loss.add(st.step, st.loss)
            if self._auto:  # on the host now: the cadence looks for a non-finite or spiking loss
                self._cadence.watch_loss(st.step, st.loss, self._step)
        if self._check_steps is not None and st.names:
            self._follow_checks(st.step)
        if self._lr_at:
            # without dbg.step, record_loss has already advanced the step when the optimizer
            # of this one runs: its rate is then filed under the next step
            st.lr = self._lr_at.get(st.step, self._lr_at.get(st.step + 1))
            for s in [s for s in self._lr_at if s < st.step]:
                del self._lr_at[s]
        if self._detectors is None:
            self._build_detectors()
        # a step that recorded only its loss (nine in ten at every=10) goes to the detectors that read those
        loss_only = not st.names and not st.has_backward and st.inputs is None
        for det in self._loss_readers if loss_only else self._detectors:
            try:
                for ev in det.update(st):
                    self._add_event(ev)
            except Exception as e:  # noqa: BLE001
                self._failed((det.name, type(e).__name__), f"detector {det.name} failed: {e!r}")
        if st.names:
            self._parts.call("checked_step", st)

    def _add_event(self, ev: Event) -> None:
        if self.rank is not None:
            ev = dataclasses.replace(ev, rank=self.rank)
        if not self._auto:
            self._log.add(ev)
            return
        n = len(self._log)
        self._log.add(ev)
        if len(self._log) > n and (ev.type, ev.kind) in ALARM_EVENTS:
            # the onset of an acute episode (a hit merged into an open one is not): check densely
            self._cadence.alarm(ev.step, self._step, f"{ev.type} event ({ev.kind})")

    def _follow_checks(self, step: int) -> None:
        """The event log's gaps under every="auto": hits within ``collapse_gap_checks`` checks
        (times the shares for a rotated layer's activations) of each other are one episode, as
        they are at a fixed interval, with the checks' steps read off the run."""
        steps = self._check_steps
        if steps and steps[-1] == step:
            return  # a second buffer of the same step (hooks that fired after its close)
        steps.append(step)
        k = self.config.collapse_gap_checks
        if len(steps) > k:
            self._log.gap = step - steps[-k - 1]
        if self._log.gaps and len(steps) == steps.maxlen:
            self._log.gaps[ACTIVATION] = step - steps[0]

    def _check_modules(self) -> None:
        """Follow modules added or swapped in mid-run; detectors forget the replaced layers,
        whose baselines described the old weights."""
        replaced = self._hooks.check_modules()
        if replaced is None:
            return
        self._optimizers.refresh()  # an optimizer made for the new modules holds only their parameters
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
        order = tuple(self._hooks.order)
        return DetectorContext(family=self.family, layer_order=order, input_layer=order[0] if order else None)

    def _build_detectors(self) -> None:
        self._detectors = build_detectors(self.settings.detectors, self.config, self._context())
        self._loss_readers = [d for d in self._detectors if d.reads_loss_only]
