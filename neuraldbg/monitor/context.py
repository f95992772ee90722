"""The monitor as its parts see it: :class:`PartContext`, the :class:`~neuraldbg.lifecycle.AddonContext`
a monitor hands its measurements and add-ons, and :class:`Parts`, which calls them.

A part reads the step, whether it is checked, the model and the settings, and calls
``report`` and ``add_event``; it never reaches the monitor's private state. :class:`Parts`
calls each lifecycle hook only on the parts that override it, each under the monitor's guard.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from neuraldbg.causal.nodes import check_signature
from neuraldbg.lifecycle import HOOKS, STEP_HOOKS, Addon, AddonContext, Measurement, overrides

if TYPE_CHECKING:  # pragma: no cover
    from neuraldbg.events.base import Event
    from neuraldbg.monitor.monitor import NeuralDbg
    from neuraldbg.trace import Trace


class PartContext:
    """One monitor's face to its parts (implements :class:`~neuraldbg.lifecycle.AddonContext`)."""

    __slots__ = ("_dbg",)

    def __init__(self, dbg: "NeuralDbg") -> None:
        self._dbg = dbg

    @property
    def model(self) -> Any:
        """The module the monitor was given."""
        return self._dbg.model

    @property
    def root(self) -> Any:
        """The user's module under the wrappers."""
        return self._dbg.root

    @property
    def settings(self) -> Any:
        """The monitor's :class:`~neuraldbg.monitor.settings.Settings`."""
        return self._dbg.settings

    @property
    def optimizer(self) -> Any:
        """The primary optimizer (given, or first found)."""
        return self._dbg.optimizer

    @property
    def optimizers(self) -> list[Any]:
        """Every optimizer seen stepping the model, the primary one first."""
        return list(self._dbg._optimizers.found)

    def is_primary(self, optimizer: Any) -> bool:
        """Whether ``optimizer``'s steps are the primary optimizer's."""
        return self._dbg._optimizers.is_primary(optimizer)

    def params_of(self, optimizer: Any) -> list[Any]:
        """The parameters ``optimizer`` holds."""
        return self._dbg._optimizers.params_of(optimizer)

    def accumulated_with(self, param: Any) -> tuple[Any, ...]:
        """The parameters a pass may have accumulated when ``backward_started(param)`` is called:
        none for ``None``, else ``param`` and those of its module that share its gradient hook."""
        return self._dbg._hooks.accumulated_with(param)

    @property
    def step(self) -> int:
        """The current training step."""
        return self._dbg.step

    @property
    def checked(self) -> bool:
        """Whether the current step is measured."""
        return self._dbg._hooks.buf.active

    def checked_since(self, step: int) -> bool:
        """Whether every step from ``step`` to the current one was checked."""
        return self._dbg._cadence.checked_since(step, self._dbg.step)

    @property
    def sync_every(self) -> int:
        """Checked steps batched per host transfer."""
        return self._dbg.sync_every

    @property
    def steps_set_by_loop(self) -> bool:
        """Whether the loop sets ``dbg.step``."""
        return self._dbg._user_steps

    @property
    def modules(self) -> list[tuple[str, Any]]:
        """The monitored modules."""
        return self._dbg._hooks.modules

    @property
    def order(self) -> list[str]:
        """Monitored layer names in forward order, as far as seen."""
        return self._dbg._hooks.order

    @property
    def census(self) -> list[tuple[str, Any, Any, float]]:
        """The weight census taken on entry."""
        return self._dbg._census

    @property
    def first_loss(self) -> float | None:
        """The first recorded loss, once it reached the host."""
        return self._dbg._loss.first

    @property
    def loss_is_cross_entropy(self) -> bool | None:
        """Whether the first recorded loss is a cross-entropy (``None``: unknown, or none yet): its
        autograd graph when ``record_loss`` was given one, else the gradient the loss sent into the
        model's output (``neuraldbg/monitor/measurements/losskind.py``)."""
        kind = self._dbg._loss_is_ce
        if kind is None:
            from neuraldbg.monitor.measurements.losskind import LossKind

            part = self._dbg.addon(LossKind)
            kind = part.kind() if part is not None else None
        return kind

    def measuring(self) -> bool:
        """Whether a training forward of a checked step is running now."""
        hooks = self._dbg._hooks
        return not hooks._skip_forward(hooks.buf)

    def checked_only(self, handle: Any, fn: Any) -> None:
        """Switch the part's hook with the monitor's (out on unchecked steps, ``switch.py``)."""
        self._dbg._hooks.switch.add(handle, fn)

    def release(self, handle: Any) -> None:
        """Forget the hook in the switch (or it would be put back), then remove it."""
        self._dbg._hooks.switch.forget([handle])
        handle.remove()

    def unchecked_done(self, part: Addon, hook: str) -> None:
        """Stop calling ``part``'s ``hook`` on unchecked steps."""
        self._dbg._parts.retire_unchecked(part, hook)

    def hook_done(self, part: Addon, hook: str) -> None:
        """Stop calling ``part``'s ``hook`` on any step."""
        self._dbg._parts.retire(part, hook)

    def report(self, key: tuple, msg: str, level: int = logging.WARNING) -> None:
        """Log ``msg`` once per ``key``."""
        self._dbg._report(key, msg, level)

    def add_event(self, event: "Event") -> None:
        """Add an event to the monitor's log."""
        self._dbg._add_event(event)

    def trace(self) -> "Trace":
        """The monitor's trace so far."""
        return self._dbg.trace()


class Parts:
    """A monitor's parts and the calls of their lifecycle (only to the parts that override a hook)."""

    def __init__(self, parts: list[Addon], ctx: AddonContext, fail: Callable[[str, BaseException], None]) -> None:
        for p in parts:
            if not isinstance(p, Addon):
                raise TypeError(f"a monitor part must be a neuraldbg.lifecycle.Addon, got {type(p).__name__}")
        self.all = list(parts)
        self.ctx = ctx
        self._fail = fail  # counts and reports a failure once (the monitor's)
        # (part, its bound hook) per hook: the method is looked up once, not on every call
        self._by_hook = {h: [(p, getattr(p, h)) for p in parts if overrides(p, h)] for h in HOOKS}
        # the step hooks' receivers on an unchecked step: the parts that ask for them there
        self._unchecked = {h: [pf for pf in self._by_hook[h] if pf[0].unchecked is None or h in pf[0].unchecked]
                           for h in STEP_HOOKS}
        self._heard()
        #: id(part) -> what its first failure was (its signatures then read "a monitor error")
        self.failed: dict[int, str] = {}

    def retire_unchecked(self, part: Addon, hook: str) -> None:
        """``part`` no longer receives ``hook`` on unchecked steps (still on checked ones)."""
        if hook not in self._unchecked:
            raise ValueError(f"{hook!r} is not a step hook; valid: {', '.join(STEP_HOOKS)}")
        self._unchecked[hook] = [pf for pf in self._unchecked[hook] if pf[0] is not part]
        self._heard()

    def retire(self, part: Addon, hook: str) -> None:
        """``part`` no longer receives ``hook`` at all (it has nothing left to hear there)."""
        if hook not in self._by_hook:
            raise ValueError(f"{hook!r} is not a lifecycle hook; valid: {', '.join(HOOKS)}")
        self._by_hook[hook] = [pf for pf in self._by_hook[hook] if pf[0] is not part]
        if hook in self._unchecked:
            self._unchecked[hook] = [pf for pf in self._unchecked[hook] if pf[0] is not part]
            self._heard()

    def _heard(self) -> None:
        #: whether a part asks for step_started or step_closed on unchecked steps
        self.hears_unchecked_steps = bool(self._unchecked["step_started"] or self._unchecked["step_closed"])
        #: whether a part still needs the optimizer hooks on unchecked steps
        self.hears_unchecked_optimizer = bool(self._unchecked["optimizer_pre"] or self._unchecked["optimizer_post"])

    def wants(self, hook: str) -> bool:
        """Whether any part does something on ``hook``."""
        return bool(self._by_hook[hook])

    def call(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on every part that has it, each under the guard (a failure is recorded
        against the part)."""
        self._call(self._by_hook[hook], hook, args)

    def call_step(self, hook: str, *args: Any) -> None:
        """Call a step hook (:data:`~neuraldbg.lifecycle.STEP_HOOKS`, whose last argument says
        whether the step is checked): on an unchecked step only the parts that ask for it there
        (``Addon.unchecked``)."""
        self._call(self._by_hook[hook] if args[-1] else self._unchecked[hook], hook, args)

    def _call(self, parts: list[tuple[Addon, Any]], hook: str, args: tuple) -> None:
        for part, fn in parts:
            try:
                fn(self.ctx, *args)
            except Exception as e:  # noqa: BLE001 - reported, never raised into training
                self._failed(part, hook, e)

    def _failed(self, part: Addon, hook: str, e: BaseException) -> None:
        what = f"{type(part).__name__}.{hook}"
        self.failed.setdefault(id(part), f"{what}: {type(e).__name__}")
        self._fail(what, e)

    def of_type(self, cls: type) -> Any:
        """The first part that is a ``cls``, or ``None``."""
        return next((p for p in self.all if isinstance(p, cls)), None)

    def summaries(self, values: dict[str, Any]) -> tuple[dict[str, int], dict[str, str]]:
        """Every measurement's signatures added to ``values`` (by name), each checked against its
        declaration; returns the steps they were measured by and why the others were not. A
        measurement that reports a signature it does not declare, or an invalid value, or that
        failed, is reported as an internal error (through the guard): its values are left out
        and its signatures read "a monitor error"."""
        steps: dict[str, int] = {}
        gaps: dict[str, str] = {}
        for part in self.all:
            if isinstance(part, Measurement):
                try:
                    _collect(part, values, steps, gaps)
                except Exception as e:  # noqa: BLE001 - reported; the other parts' values stay
                    self._failed(part, "summary", e)
                failed = self.failed.get(id(part))
                for sig in part.signatures:
                    if sig.name not in values and failed:
                        gaps[sig.name] = f"a monitor error ({failed})"
        return steps, gaps


def _collect(m: Measurement, values: dict[str, Any], steps: dict[str, int], gaps: dict[str, str]) -> None:
    checked = {}
    for sig, v in m.summary().items():
        if sig not in m.signatures:
            raise KeyError(f"{type(m).__name__} reported {getattr(sig, 'name', sig)!r}, which it does not declare "
                           "in its `signatures`")
        checked[sig.name] = check_signature(sig.name, v)
    values.update(checked)
    steps.update((sig.name, s) for sig, s in m.steps().items() if sig.name in checked)
    gaps.update((sig.name, r) for sig, r in m.gaps().items() if sig.name not in checked)
