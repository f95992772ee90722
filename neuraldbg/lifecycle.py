"""The monitor's extension point: parts with a lifecycle, and what they may use of the monitor.

A monitor (:class:`neuraldbg.NeuralDbg`) owns *parts*: every measurement (the weight scale on
entry, the step size, a reference loss, the token watch...) and the optional add-ons (autosave,
the snapshots of ``neuraldbg/verify``). Each is an :class:`Addon`: the monitor tells it when it
is entered, when a step starts and closes, each checked step's host-side statistics, each
optimizer step (before and after), when a query wants everything so far, and when it exits. A
part sees the monitor only through an :class:`AddonContext` -- the step, whether it is checked,
the model, the settings, ``report`` and ``add_event`` -- never through its private state.

A :class:`Measurement` is a part that produces *signatures*: it declares the
:class:`~neuraldbg.trace.Signature` s it may report and returns their values from
:meth:`Measurement.summary`; the monitor checks each against its declaration. Parts are called
under the monitor's guard: one that raises is reported once, counted, and never raises into
the training loop. Pure Python, so any layer (``neuraldbg/verify`` too) can define parts
without importing the monitor.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from neuraldbg.events.base import Event
    from neuraldbg.events.stepstats import StepStats
    from neuraldbg.trace import Signature, Trace

#: the lifecycle calls, in the order a run makes them
HOOKS = ("enter", "step_started", "backward_started", "step_closed", "checked_step", "optimizer_pre",
         "optimizer_post", "flush", "exit")


@runtime_checkable
class AddonContext(Protocol):
    """What a part may use of its monitor (the monitor's public face to its parts)."""

    @property
    def model(self) -> Any:
        """The module the monitor was given (wrappers included)."""

    @property
    def root(self) -> Any:
        """The user's module under ``torch.compile``, ``DataParallel`` and DDP wrappers."""

    @property
    def settings(self) -> Any:
        """The monitor's arguments (:class:`neuraldbg.monitor.settings.Settings`)."""

    @property
    def optimizer(self) -> Any:
        """The primary optimizer: the one given (``optimizer=``), else the first one found
        stepping the model (``None`` before)."""

    @property
    def optimizers(self) -> list[Any]:
        """Every optimizer seen stepping the model's parameters, the primary one first."""

    def is_primary(self, optimizer: Any) -> bool:
        """Whether ``optimizer``'s steps are the primary optimizer's (every one when none was given)."""

    def params_of(self, optimizer: Any) -> list[Any]:
        """The parameters ``optimizer`` holds."""

    def accumulated_with(self, param: Any) -> tuple[Any, ...]:
        """The parameters a backward pass may have accumulated by the time ``param`` is passed
        to ``backward_started``: none for ``None`` (the output's gradient noticed the pass), else
        ``param`` and the parameters of its module that share its gradient hook (on models above
        ``DetectorConfig.group_param_hooks_above`` parameters)."""

    @property
    def step(self) -> int:
        """The current training step."""

    @property
    def checked(self) -> bool:
        """Whether the current step is a checked (measured) one."""

    def checked_since(self, step: int) -> bool:
        """Whether every step from ``step`` to the current one was checked (always at
        ``every=1``, never across steps at a fixed ``every > 1``; under ``every="auto"``, within
        a dense window)."""

    @property
    def sync_every(self) -> int:
        """Checked steps batched per host transfer (parts that queue device values follow it)."""

    @property
    def steps_set_by_loop(self) -> bool:
        """Whether the loop sets ``dbg.step`` (else ``record_loss`` closes each step)."""

    @property
    def modules(self) -> list[tuple[str, Any]]:
        """The monitored modules, ``(qualified name, module)``."""

    @property
    def order(self) -> list[str]:
        """Monitored layer names in forward order, as far as seen."""

    @property
    def census(self) -> list[tuple[str, Any, Any, float]]:
        """``(layer, module, weight, norm)`` of every dense weight matrix, measured on entry."""

    @property
    def first_loss(self) -> float | None:
        """The first recorded loss, once it reached the host (``None`` before)."""

    @property
    def loss_is_cross_entropy(self) -> bool | None:
        """Whether the first loss given to ``record_loss`` is a cross-entropy (its autograd graph
        ends in a negative log-likelihood); ``None`` when it cannot be told (a number, a detached
        tensor) or no loss was recorded yet."""

    def measuring(self) -> bool:
        """Whether a training forward of a checked step is running now (what hooks measure)."""

    def checked_only(self, handle: Any, fn: Any) -> None:
        """Keep the part's hook ``fn`` (registered as ``handle``) out of the model on unchecked
        steps, with the monitor's own: an unchecked step then calls none of it."""

    def release(self, handle: Any) -> None:
        """Remove a hook registered with :meth:`checked_only` (it is forgotten by the switch)."""

    def unchecked_done(self, part: "Addon", hook: str) -> None:
        """``part`` no longer needs ``hook`` on unchecked steps (its window closed): an unchecked
        step stops calling it there, and once no part needs the optimizer hooks there, an
        unchecked step's optimizer step runs none of the monitor's Python."""

    def hook_done(self, part: "Addon", hook: str) -> None:
        """``part`` has nothing left to hear on ``hook`` (it read what it needed): no step calls
        it there any more, checked or not."""

    def report(self, key: tuple, msg: str, level: int = logging.WARNING) -> None:
        """Log ``msg`` once per ``key`` through the ``neuraldbg`` logger."""

    def add_event(self, event: "Event") -> None:
        """Add an event to the monitor's log (rank and collapsing are the monitor's)."""

    def trace(self) -> "Trace":
        """The monitor's trace so far (a query: it moves waiting statistics to the host)."""


#: the lifecycle calls made on unchecked steps as well as checked ones
STEP_HOOKS = ("step_started", "step_closed", "optimizer_pre", "optimizer_post")


class Addon:
    """A part of a monitor: every lifecycle call is a no-op here; override the ones you need."""

    #: the :data:`STEP_HOOKS` this part needs on *unchecked* steps (``None``: all it overrides).
    #: A part that acts only on checked steps lists fewer, and an unchecked step then runs none
    #: of its Python: on a fast step of a deep model every call shows in the step time.
    unchecked: ClassVar[tuple[str, ...] | None] = None

    def enter(self, ctx: AddonContext) -> None:
        """The monitor's hooks are registered and the weights measured (before the first step)."""

    def step_started(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """Step ``step`` starts (before its forward); ``checked``: whether it is measured."""

    def backward_started(self, ctx: AddonContext, param: Any) -> None:
        """A backward pass of a checked step that accumulates parameter gradients started:
        ``param`` None where the model output's gradient noticed it (no parameter has
        accumulated yet), else the parameter whose hook did; every parameter not in
        ``ctx.accumulated_with(param)`` still holds what it held before the pass."""

    def step_closed(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """Step ``step`` was closed and its statistics queued for the host."""

    def checked_step(self, ctx: AddonContext, stats: "StepStats") -> None:
        """A checked step's statistics, on the host (after the detectors read them)."""

    def optimizer_pre(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """An optimizer step is about to run; ``checked``: it belongs to a checked step."""

    def optimizer_post(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """An optimizer step has run."""

    def flush(self, ctx: AddonContext) -> None:
        """A query wants every result so far: process what is waiting."""

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """The ``with`` block ended (``exc``: what it raised, if anything); hooks are removed."""


class Measurement(Addon):
    """A part that measures signatures: it declares them in :attr:`signatures` and returns
    their values from :meth:`summary` (and, where it knows, the step each was measured by
    from :meth:`steps`)."""

    #: the signatures this measurement may report (their declarations live with the evidence
    #: node that reads them, ``neuraldbg/causal/nodes/``)
    signatures: ClassVar[tuple["Signature", ...]] = ()

    @classmethod
    def for_monitor(cls, root: Any, settings: Any) -> "Measurement | None":
        """The instance a monitor of ``root`` built with ``settings`` runs, or ``None`` where this
        measurement does not apply (no optimizer to hook, no embedding to watch...)."""
        return cls()

    def summary(self) -> dict["Signature", Any]:
        """The measured values so far, by declaration (nothing yet: an empty dict)."""
        return {}

    def steps(self) -> dict["Signature", int]:
        """The step by which each value was measured, where the measurement knows it."""
        return {}

    def gaps(self) -> dict["Signature", str]:
        """Why a declared signature was not measured, where the measurement knows (no optimizer
        found, not at initialization, an unsupported tensor type...)."""
        return {}


def overrides(part: Addon, hook: str) -> bool:
    """Whether ``part`` does something on ``hook`` (the monitor calls only those)."""
    return getattr(type(part), hook) is not getattr(Addon, hook)
