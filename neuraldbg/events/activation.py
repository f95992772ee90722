"""Activation regime: dead ReLU units and saturated bounded activations, per layer."""
from __future__ import annotations

import numpy as np

from neuraldbg.events.base import ACTIVATION, Event, make_event
from neuraldbg.events.registry import Detector, register_detector
from neuraldbg.events.stepstats import LayerIndex, StepStats, grown


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
    the event is dated at the first of them. A step where a layer was not observed (its
    module did not run, or its output was not finite) neither extends nor breaks its run.
    Streaks live in numpy arrays over layers (a :class:`Streak` per layer, vectorized).
    """

    reads_loss_only = False  # a loss-only step returns no hits here

    STATS = (("dead_frac", "dead", "dead_fraction"), ("sat_frac", "saturated", "saturated_fraction"))

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._index = LayerIndex()
        self._len = {stat: np.zeros(0, dtype=np.int64) for stat, _, _ in self.STATS}
        self._start = {stat: np.zeros(0, dtype=np.int64) for stat, _, _ in self.STATS}
        self._running = {stat: 0 for stat, _, _ in self.STATS}  # layers with a run going on

    def update(self, stats: StepStats) -> list[Event]:
        """Dead/saturated hits at this step."""
        if not stats.names:
            return []
        events = []
        idx = None
        cols = stats.cols
        for stat, kind, threshold_name in self.STATS:
            frac = cols[stat]
            threshold = getattr(self.config, threshold_name)
            top = np.fmax.reduce(frac) if len(frac) else np.nan
            if top != top or (top < threshold and not self._running[stat]):
                continue  # not measured, or nothing holds and no run to break: nothing changes
            pos = np.flatnonzero(~np.isnan(frac))
            # NaN outputs compare false everywhere and would read as "dead"
            ok = np.isfinite(cols["out_sum"][pos]) | ~stats.has_out[pos]
            if not ok.all():
                pos = pos[ok]
            if idx is None:
                idx = self._index.of(stats.names)
                if len(self._index) > len(self._len[stat]):
                    for d in (self._len, self._start):
                        for k in d:
                            d[k] = grown(d[k], len(self._index), 0)
            at = idx[pos]
            holds = frac[pos] >= threshold
            length, start = self._len[stat], self._start[stat]
            run = length[at]
            start[at[holds & (run == 0)]] = stats.step
            run = length[at] = np.where(holds, run + 1, 0)
            self._running[stat] = int(np.count_nonzero(length))
            n_req = self.config.regime_persistence
            for j in np.flatnonzero(run >= n_req):
                i, n = pos[j], int(run[j])
                # the first report covers the whole run that established the regime
                first = n == n_req
                f = float(frac[i])
                events.append(make_event(ACTIVATION, kind, stats.names[i],
                                         int(start[at[j]]) if first else stats.step, f,
                                         {stat: f, "threshold": threshold},
                                         end_step=stats.step, count=n if first else 1))
        return events
