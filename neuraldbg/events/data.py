"""Data anomalies: NaN/Inf at the input boundary or born inside the network, and input shift."""
from __future__ import annotations

import math
import statistics

import numpy as np

from neuraldbg.events.base import DATA, Event, make_event
from neuraldbg.events.registry import Detector, register_detector
from neuraldbg.events.stepstats import StepStats


def first_nonfinite_layer(stats: StepStats, order: tuple[str, ...],
                          positions: np.ndarray | None = None) -> tuple[str, str] | None:
    """(layer, 'nan'|'inf') of the earliest layer in forward order whose output is not finite.

    ``positions`` (optional) are the positions of ``order``'s layers in ``stats.names``, -1
    for a layer the step does not name (:func:`order_positions`; detectors cache them). Most
    steps need no search: callers screen them with ``stats.outputs_finite()`` first.
    """
    pos = order_positions(stats.names, order) if positions is None else positions
    if not len(pos):
        return None
    ok = pos >= 0
    at = np.where(ok, pos, 0)
    s = stats.cols["out_sum"][at]
    bad = np.flatnonzero(ok & stats.has_out[at] & ~np.isfinite(s))
    if not len(bad):
        return None
    i = bad[0]
    return order[i], "nan" if math.isnan(s[i]) else "inf"


def order_positions(names: tuple[str, ...], order: tuple[str, ...]) -> np.ndarray:
    """Positions of ``order``'s layers in ``names`` (-1 where absent)."""
    where = {n: i for i, n in enumerate(names)}
    return np.fromiter((where.get(n, -1) for n in order), dtype=np.intp, count=len(order))


def shift_score(mean: float, std: float, ref_mean: float, ref_std: float) -> tuple[float, float]:
    """(scale ratio std/ref_std, |mean - ref_mean| / ref_std) of a batch against a reference."""
    if ref_std <= 0 or not math.isfinite(ref_std):
        return 1.0, 0.0
    return std / ref_std, abs(mean - ref_mean) / ref_std


@register_detector("data")
class DataAnomalyDetector(Detector):
    """NaN/Inf and distribution shift.

    NaN/Inf: in the model input -> an event at the input layer with ``at_input = 1``;
    otherwise the earliest layer whose output is not finite, ``at_input = 0`` (born inside).
    An episode lasts while anything stays non-finite and keeps its origin layer, so a NaN
    batch that poisons the weights reads as one event, not one per layer.

    Shift: the input's mean and std against a reference (medians over ``warmup_checks``
    checked steps after ``shift_skip_checks``); beyond ``shift_scale_factor`` in scale or
    ``shift_mean_z`` reference standard deviations in mean.
    """

    reads_loss_only = False  # a loss-only step returns no hits here

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._episode: tuple[str, str, float] | None = None  # (layer, kind, at_input)
        self._seen = 0
        self._ref_samples: list[tuple[float, float]] = []
        self._ref: tuple[float, float] | None = None
        self._positions: tuple | None = None  # (names, layer_order, their positions)

    def update(self, stats: StepStats) -> list[Event]:
        """NaN/Inf/shift hits at this step."""
        if stats.inputs is None and (not stats.names or not stats.n_layers_seen):
            return []  # a loss-only step: no activations were observed
        events: list[Event] = []
        inp = stats.inputs
        input_layer = self.context.input_layer
        origin: tuple[str, str, float] | None = None
        values: dict[str, float] = {}
        if inp is not None and (inp.get("nan", 0) > 0 or inp.get("inf", 0) > 0) and input_layer:
            kind = "nan" if inp.get("nan", 0) > 0 else "inf"
            origin = (inp.get("layer") or input_layer, kind, 1.0)  # "layer": a sub-network's entry
            values = {"nan_count": inp.get("nan", 0.0), "inf_count": inp.get("inf", 0.0),
                      "fraction": (inp.get("nan", 0) + inp.get("inf", 0)) / max(inp.get("n", 1), 1)}
        else:
            found = None
            if not stats.outputs_finite():  # the positions only then (steps alternate structures)
                order = self.context.layer_order
                cached = self._positions
                if cached is None or cached[0] is not stats.names or cached[1] is not order:
                    cached = self._positions = (stats.names, order, order_positions(stats.names, order))
                found = first_nonfinite_layer(stats, order, cached[2])
            if found is not None:
                origin = (found[0], found[1], 0.0)
        if origin is None:
            self._episode = None
        else:
            if self._episode is None:
                self._episode = origin
            layer, kind, at_input = self._episode
            events.append(make_event(DATA, kind, layer, stats.step, 6.0,
                                     {"at_input": at_input, **values}))
            return events  # statistics of a non-finite batch say nothing about its distribution
        ms = stats.input_mean_std()
        if ms is None or input_layer is None:
            return events
        mean, std = ms
        self._seen += 1
        if self._ref is None:
            if self._seen > self.config.shift_skip_checks:
                self._ref_samples.append((mean, std))
                if len(self._ref_samples) >= self.config.warmup_checks:
                    self._ref = (statistics.median(m for m, _ in self._ref_samples),
                                 statistics.median(s for _, s in self._ref_samples))
            return events
        ratio, z = shift_score(mean, std, *self._ref)
        f = self.config.shift_scale_factor
        if ratio > f or ratio < 1.0 / f or z > self.config.shift_mean_z:
            sev = max(abs(math.log10(max(ratio, 1e-30))), z / self.config.shift_mean_z)
            events.append(make_event(DATA, "shift", input_layer, stats.step, sev, {
                "scale_ratio": ratio, "mean_z": z, "mean": mean, "std": std,
                "ref_mean": self._ref[0], "ref_std": self._ref[1]}))
        return events
