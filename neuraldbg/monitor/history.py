"""The loss curve of a monitored run, kept in bounded memory."""
from __future__ import annotations

import math

from neuraldbg.trace import LossSummary


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
