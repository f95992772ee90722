"""Activation regime: dead ReLU units and saturated bounded activations, per layer."""
from __future__ import annotations

from neuraldbg.events.base import ACTIVATION, Event, make_event
from neuraldbg.events.registry import Detector, register_detector
from neuraldbg.events.stepstats import StepStats


class Streak:
    """Counts consecutive checks a condition holds; remembers where the run started."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.length = 0

    def push(self, holds: bool, step: int) -> int:
        """Record one check; return the run length (0 when the condition broke)."""
        if holds:
            if self.length == 0:
                self.start = step
            self.length += 1
        else:
            self.start, self.length = None, 0
        return self.length


@register_detector("activation")
class ActivationRegimeDetector(Detector):
    """Dead (ReLU never active over the batch) and saturated (bounded output near a bound).

    Saturation is measured only on bounded activations (sigmoid, tanh, hardtanh, softmax):
    never on unbounded outputs. A regime must hold ``regime_persistence`` checks in a row;
    the event is dated at the first of them.
    """

    STATS = (("dead_frac", "dead", "dead_fraction"), ("sat_frac", "saturated", "saturated_fraction"))

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._streaks: dict[tuple[str, str], Streak] = {}

    def update(self, stats: StepStats) -> list[Event]:
        """Dead/saturated hits at this step."""
        events = []
        for layer, d in stats.layers.items():
            if stats.out_finite(layer) is False:
                continue  # NaN outputs compare false everywhere and would read as "dead"
            for stat, kind, threshold_name in self.STATS:
                if stat not in d:
                    continue
                frac = d[stat]
                threshold = getattr(self.config, threshold_name)
                streak = self._streaks.setdefault((layer, kind), Streak())
                n = streak.push(frac >= threshold, stats.step)
                if n >= self.config.regime_persistence:
                    # the first report covers the whole run that established the regime
                    first = n == self.config.regime_persistence
                    events.append(make_event(ACTIVATION, kind, layer, streak.start if first else stats.step,
                                             frac, {stat: frac, "threshold": threshold},
                                             end_step=stats.step, count=n if first else 1))
        return events
