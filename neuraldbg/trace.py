"""What a monitored run leaves behind, independent of torch: the input of the causal engine.

A :class:`Trace` is built by :class:`neuraldbg.NeuralDbg` (live) or read back from an export
(:func:`neuraldbg.load_session`); the causal queries only ever see a ``Trace``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neuraldbg.events.base import Event


@dataclass(frozen=True)
class LayerInfo:
    """A monitored leaf module: qualified name, class name, and position in forward order."""

    name: str
    type: str
    index: int
    n_params: int = 0


@dataclass(frozen=True)
class LossSummary:
    """Compact loss history: a few anchors plus a downsampled curve (``history``)."""

    n: int = 0
    first: float | None = None
    last: float | None = None
    min: float | None = None
    n_nonfinite: int = 0
    first_nonfinite_step: int | None = None
    history: tuple[tuple[int, float], ...] = ()  # (step, loss), downsampled


@dataclass(frozen=True)
class Trace:
    """Events plus the context needed to interpret them.

    ``layers`` is in forward execution order (first call), so index 0 is the input side.
    ``first_step``/``last_step`` bound the observed steps.
    """

    events: tuple[Event, ...]
    layers: tuple[LayerInfo, ...]
    family: str
    first_step: int = 0
    last_step: int = 0
    loss: LossSummary = field(default_factory=LossSummary)
    rank: int | None = None
    world_size: int | None = None
    meta: tuple[tuple[str, Any], ...] = ()

    @property
    def n_steps(self) -> int:
        """Number of observed steps (inclusive span)."""
        return max(0, self.last_step - self.first_step + 1)

    def layer_index(self, name: str | None) -> int | None:
        """Forward-order index of a layer, ``None`` for loss events or unknown names."""
        if name is None:
            return None
        for info in self.layers:
            if info.name == name:
                return info.index
        return None

    def relative_depth(self, name: str | None) -> float | None:
        """Position of a layer in 0 (input side) .. 1 (output side)."""
        idx = self.layer_index(name)
        if idx is None or not self.layers:
            return None
        n = max(info.index for info in self.layers)
        return 0.0 if n == 0 else idx / n
