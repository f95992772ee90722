"""Optional parts of the monitor that follow its lifecycle (autosave, snapshots, ...).

An :class:`Addon` is told when the monitor is entered, when a step starts and closes, and when
the monitor exits. The monitor calls them under its own guard, so an add-on that fails is
reported once and never raises into the training loop. Add-ons keep the façade
(``monitor.py``) small: each optional feature lives in its own module. The monitor calls only
the methods an add-on has, so one that may not import this module (the snapshots of
``neuraldbg/verify``, which the monitor imports) follows the same protocol without the base.
"""
from __future__ import annotations

from typing import Any


class Addon:
    """Base class: every method is a no-op, override the ones you need."""

    def enter(self, dbg: Any) -> None:
        """The monitor's hooks are registered and the weights measured."""

    def step_started(self, dbg: Any, step: int, checked: bool) -> None:
        """Step ``step`` starts (before its forward); ``checked`` says whether it is monitored."""

    def step_closed(self, dbg: Any, step: int, checked: bool) -> None:
        """Step ``step`` was closed and its statistics queued for the host."""

    def flush(self, dbg: Any) -> None:
        """A query wants every result so far: process what is waiting."""

    def exit(self, dbg: Any, exc: BaseException | None) -> None:
        """The ``with`` block ended (``exc`` is what it raised, if anything); hooks are removed."""

    def signatures(self) -> dict[str, float]:
        """Measurements this add-on adds to the trace's ``meta``."""
        return {}


def dist_rank() -> tuple[int | None, int | None]:
    """``(rank, world_size)`` under an initialized ``torch.distributed``, else ``(None, None)``."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a broken distributed setup must not stop the monitor
        pass
    return None, None
