"""Host-side statistics of one checked step: what detectors read.

The monitor transfers per-layer sums computed on the device; derived quantities
(RMS, mean and std) are computed here from those sums, plain floats in, floats out, so that
detectors never need torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def rms(sumsq: float, n: float) -> float:
    """Root mean square from a sum of squares over ``n`` elements."""
    if n <= 0:
        return float("nan")
    return math.sqrt(sumsq / n) if sumsq >= 0 else float("nan")


def mean_std(total: float, sumsq: float, n: float) -> tuple[float, float]:
    """Mean and (population) standard deviation from running sums."""
    if n <= 0:
        return float("nan"), float("nan")
    m = total / n
    var = max(sumsq / n - m * m, 0.0)
    return m, math.sqrt(var)


@dataclass
class StepStats:
    """Floats for one checked step.

    ``layers`` maps a layer name to flat stat names: ``out_sum``, ``out_sumsq``, ``out_n``,
    ``dead_frac`` / ``sat_frac`` (activation modules only), ``pgrad_sumsq``/``pgrad_n``
    (parameter gradients), ``gout_sumsq``/``gout_n`` (gradient w.r.t. the output).
    ``inputs`` holds the model input's ``sum``, ``sumsq``, ``nan``, ``inf``, ``n``.
    """

    step: int
    loss: float | None = None
    inputs: dict[str, float] | None = None
    layers: dict[str, dict[str, float]] = field(default_factory=dict)
    has_backward: bool = False
    #: the GradScaler scale in force during this step's backward (``None``: no scaler);
    #: gradient sums of squares here are already divided by its square
    grad_scale: float | None = None

    def nonfinite_grad_layers(self) -> list[str]:
        """Layers whose parameter-gradient sum of squares is NaN or Inf this step."""
        return [k for k, d in self.layers.items()
                if d.get("pgrad_n", 0) > 0 and not math.isfinite(d.get("pgrad_sumsq", 0.0))]

    def grad_rms(self, layer: str) -> float | None:
        """RMS of the layer's parameter gradients, ``None`` when it has none this step."""
        d = self.layers.get(layer)
        if not d or d.get("pgrad_n", 0) <= 0:
            return None
        return rms(d["pgrad_sumsq"], d["pgrad_n"])

    def out_finite(self, layer: str) -> bool | None:
        """Whether the layer's output sums were finite (``None``: no output stats)."""
        d = self.layers.get(layer)
        if not d or "out_sum" not in d:
            return None
        return math.isfinite(d["out_sum"])

    def input_mean_std(self) -> tuple[float, float] | None:
        """Mean and std of the finite model-input entries."""
        if not self.inputs or self.inputs.get("n", 0) <= 0:
            return None
        n = self.inputs["n"] - self.inputs.get("nan", 0) - self.inputs.get("inf", 0)
        return mean_std(self.inputs["sum"], self.inputs["sumsq"], n)
