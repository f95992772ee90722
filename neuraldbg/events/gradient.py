"""Gradient health: vanishing and exploding parameter gradients, per layer."""
from __future__ import annotations

import math
import statistics

from neuraldbg.events.base import GRADIENT, Event, make_event
from neuraldbg.events.registry import Detector, register_detector
from neuraldbg.events.stepstats import StepStats


def vanishing_layers(rms_by_layer: dict[str, float], abs_floor: float, ratio: float) -> dict[str, float]:
    """Layers whose gradient RMS is below ``abs_floor`` or below ``ratio`` x the largest layer's.

    Returns layer -> ratio to the largest RMS. Pure: finite RMS values in, dict out.
    """
    finite = {k: v for k, v in rms_by_layer.items() if math.isfinite(v)}
    if not finite:
        return {}
    top = max(finite.values())
    out = {}
    for layer, r in finite.items():
        rel = r / top if top > 0 else 0.0
        if r < abs_floor or (len(finite) > 1 and rel < ratio):
            out[layer] = rel
    return out


def exploding_layers(rms_by_layer: dict[str, float], baselines: dict[str, float], *, abs_ceiling: float,
                     rel: float, ratio: float, floor: float) -> dict[str, float]:
    """Layers whose gradient RMS exploded: infinite, above ``abs_ceiling``, or grown ``rel`` x
    over their own warm-up baseline. Growth is only trusted where the baseline is above
    ``floor`` (a vanished baseline makes every ratio huge). A layer ``ratio`` x above the
    smallest layer counts only when it also grew half of ``rel`` over its own baseline, so
    that a healthy spread across layers never fires.

    Returns layer -> growth factor (inf for infinite gradients).
    """
    out: dict[str, float] = {}
    finite = [v for v in rms_by_layer.values() if math.isfinite(v) and v > 0]
    low = min(finite) if finite else 0.0
    for layer, r in rms_by_layer.items():
        if math.isinf(r):
            out[layer] = math.inf
            continue
        if not math.isfinite(r):
            continue  # NaN: the data detector owns non-finite values
        base = baselines.get(layer)
        growth = r / base if base is not None and base > floor else None
        if r > abs_ceiling:
            out[layer] = growth if growth is not None else r / abs_ceiling
        elif growth is not None and growth > rel:
            out[layer] = growth
        elif growth is not None and growth > rel / 2 and low > 0 and r / low > ratio:
            out[layer] = growth
    return out


def _out_rms(stats: StepStats, layer: str) -> float:
    d = stats.layers.get(layer, {})
    n = d.get("out_n", 0)
    return math.sqrt(d["out_sumsq"] / n) if n and math.isfinite(d.get("out_sumsq", math.nan)) else math.nan


@register_detector("gradient")
class GradientHealthDetector(Detector):
    """Vanishing/exploding gradients from per-layer parameter-gradient RMS.

    Baseline per layer: median RMS over the first ``warmup_checks`` checked steps with a
    backward pass. Steps without backward (evaluation) are ignored.

    Under a ``GradScaler`` (``stats.grad_scale`` set) a step with non-finite gradients is
    one the scaler skips: it is ignored unless overflows recur on ``config.scaler_overflow_patience``
    consecutive backward steps, which is then reported as ``exploding`` in every
    non-finite layer (``overflow_steps`` in the values).
    """

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._warm: dict[str, list[float]] = {}
        self._base: dict[str, float] = {}
        # layers that vanished while their baseline was forming: growth from there is
        # recovery, not explosion, so their baseline is not used for relative growth
        self._vanished_warm: set[str] = set()
        self._overflow_run = 0

    def forget_layer(self, layer: str) -> None:
        """Drop a layer's baseline (the module behind the name was replaced)."""
        self._warm.pop(layer, None)
        self._base.pop(layer, None)
        self._vanished_warm.discard(layer)

    def update(self, stats: StepStats) -> list[Event]:
        """Vanishing/exploding hits at this step."""
        if not stats.has_backward:
            return []
        if stats.grad_scale is not None:
            overflow = self._scaler_overflow(stats)
            if overflow is not None:
                return overflow
        rms_by_layer = {}
        for layer in stats.layers:
            r = stats.grad_rms(layer)
            # exactly zero is no observation, not a vanished signal: a downstream factor that
            # is zero by design (a LoRA A while its B is still 0) stops it exactly
            if r is not None and r != 0.0:
                rms_by_layer[layer] = r
        if not rms_by_layer:
            return []
        cfg = self.config
        events: list[Event] = []
        trusted = {k: v for k, v in self._base.items() if k not in self._vanished_warm}
        exploding = exploding_layers(rms_by_layer, trusted, abs_ceiling=cfg.explode_abs,
                                     rel=cfg.explode_rel, ratio=cfg.explode_ratio, floor=cfg.vanish_abs)
        for layer, growth in exploding.items():
            r = rms_by_layer[layer]
            sev = 6.0 if math.isinf(growth) else math.log10(max(growth, 1.0))
            events.append(make_event(GRADIENT, "exploding", layer, stats.step, sev, {
                "grad_rms": r, "baseline_rms": self._base.get(layer, math.nan), "growth": growth,
                "out_rms": _out_rms(stats, layer)}))
        if not exploding:
            # one exploding layer makes every other layer look vanished next to it
            for layer, rel in vanishing_layers(rms_by_layer, cfg.vanish_abs, cfg.vanish_ratio).items():
                r = rms_by_layer[layer]
                sev = min(-math.log10(max(rel, 1e-30)), 30.0) / 3.0
                # out_rms separates tiny weights (tiny activations) from deep saturating
                # stacks (normal activations, gradients shrunk by the derivatives)
                events.append(make_event(GRADIENT, "vanishing", layer, stats.step, sev, {
                    "grad_rms": r, "ratio_to_max": rel, "out_rms": _out_rms(stats, layer)}))
                if layer not in self._base:
                    self._vanished_warm.add(layer)
        self._learn_baseline(rms_by_layer)
        return events

    def _scaler_overflow(self, stats: StepStats) -> list[Event] | None:
        """``None`` for a normal step; else the events of a scaler-overflow step (often none)."""
        bad = stats.nonfinite_grad_layers()
        if not bad:
            self._overflow_run = 0
            return None
        self._overflow_run += 1
        patience = self.config.scaler_overflow_patience
        if self._overflow_run < patience:
            return []  # the scaler skips this optimizer step and lowers its scale: by design
        order = {name: i for i, name in enumerate(self.context.layer_order)}
        return [make_event(GRADIENT, "exploding", layer, stats.step, 6.0, {
            "grad_rms": math.inf, "baseline_rms": self._base.get(layer, math.nan), "growth": math.inf,
            "overflow_steps": float(self._overflow_run), "grad_scale": float(stats.grad_scale),
            "out_rms": _out_rms(stats, layer)})
            for layer in sorted(bad, key=lambda n: order.get(n, len(order)))]

    def _learn_baseline(self, rms_by_layer: dict[str, float]) -> None:
        for layer, r in rms_by_layer.items():
            if layer in self._base or not math.isfinite(r):
                continue
            w = self._warm.setdefault(layer, [])
            w.append(r)
            if len(w) >= self.config.warmup_checks:
                self._base[layer] = statistics.median(w)
                del self._warm[layer]
