"""Per-module statistics computed on the device, as pure functions of tensors.

Each function returns a small 1-d float32 tensor (a few reductions) and never moves data
to the host: the monitor concatenates one step's results and transfers them once. Derived
quantities (RMS, mean and std) are computed on the host from these sums, by the float helpers
of :mod:`neuraldbg.events.stepstats`.
"""
from __future__ import annotations

import torch
from torch import nn

#: Activation modules whose output is >= 0 with "off" at 0: a unit is dead when it is
#: never positive over the batch.
RELU_LIKE: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6)
#: Bounded activations and (lower, upper) bounds. Saturation is only ever measured here,
#: never on unbounded outputs such as Linear (a known false-alarm source of earlier tools).
BOUNDED: dict[type[nn.Module], tuple[float, float]] = {
    nn.Sigmoid: (0.0, 1.0),
    nn.Tanh: (-1.0, 1.0),
    nn.Hardtanh: (-1.0, 1.0),
    nn.Hardsigmoid: (0.0, 1.0),
    nn.Softsign: (-1.0, 1.0),
}
SOFTMAX: tuple[type[nn.Module], ...] = (nn.Softmax,)

#: stat layout of each group; the monitor splits the transferred vector with these names
OUT_FIELDS = ("sum", "sumsq")
DEAD_FIELDS = OUT_FIELDS + ("dead_frac",)
SAT_FIELDS = OUT_FIELDS + ("sat_frac",)
INPUT_FIELDS = ("sum", "sumsq", "nan", "inf")
GRAD_FIELDS = ("sumsq",)


def activation_kind(module: nn.Module) -> str:
    """'relu', 'bounded', 'softmax' or 'plain': which regime statistics apply to a module."""
    if isinstance(module, RELU_LIKE):
        return "relu"
    if isinstance(module, SOFTMAX):
        return "softmax"
    if isinstance(module, tuple(BOUNDED)):
        return "bounded"
    return "plain"


def bounds_of(module: nn.Module) -> tuple[float, float] | None:
    """The output bounds of a bounded activation module (Hardtanh reads its own)."""
    if isinstance(module, nn.Hardtanh):
        return (float(module.min_val), float(module.max_val))
    for cls, b in BOUNDED.items():
        if isinstance(module, cls):
            return b
    return None


def unit_reduce_dims(y: torch.Tensor) -> tuple[int, ...]:
    """Dims to reduce over to get one value per unit.

    Units are features (last dim) for (N, F) and (N, T, F) outputs and channels (dim 1)
    for convolutional maps (N, C, ...) with 4 or more dims.
    """
    if y.dim() <= 1:
        return tuple(range(y.dim()))
    if y.dim() >= 4:
        return tuple(d for d in range(y.dim()) if d != 1)
    return tuple(range(y.dim() - 1))


def sums(y: torch.Tensor) -> torch.Tensor:
    """[sum, sum of squares] in float32 (float32 even for half inputs, so sums do not overflow)."""
    y = y.detach().float()
    return torch.stack((y.sum(), (y * y).sum()))


def dead_fraction(y: torch.Tensor) -> torch.Tensor:
    """Fraction of units never positive anywhere in the batch (0-d tensor)."""
    y = y.detach()
    if y.dim() == 0:
        return (y <= 0).float()
    active = (y > 0).any(dim=0) if y.dim() <= 3 else (y > 0).transpose(0, 1).flatten(1).any(dim=1)
    if y.dim() == 3:
        active = active.any(dim=0)
    return 1.0 - active.float().mean()


def saturated_fraction(y: torch.Tensor, low: float, high: float, margin: float) -> torch.Tensor:
    """Fraction of elements within ``margin`` (relative to the range) of either bound."""
    y = y.detach().float()
    eps = margin * (high - low)
    return ((y <= low + eps) | (y >= high - eps)).float().mean()


def softmax_saturated_fraction(y: torch.Tensor, dim: int | None, margin: float) -> torch.Tensor:
    """Fraction of softmax rows whose largest probability is within ``margin`` of 1."""
    y = y.detach().float()
    d = -1 if dim is None else dim
    return (y.amax(dim=d) >= 1.0 - margin).float().mean()


def output_stats(y: torch.Tensor, kind: str, *, bounds: tuple[float, float] | None = None,
                 softmax_dim: int | None = None, margin: float = 0.01) -> torch.Tensor:
    """Stats of a module output: :data:`OUT_FIELDS`, plus dead or saturated fraction by ``kind``."""
    base = sums(y)
    if kind == "relu":
        return torch.cat((base, dead_fraction(y).reshape(1)))
    if kind == "bounded" and bounds is not None:
        return torch.cat((base, saturated_fraction(y, bounds[0], bounds[1], margin).reshape(1)))
    if kind == "softmax":
        return torch.cat((base, softmax_saturated_fraction(y, softmax_dim, margin).reshape(1)))
    return base


def input_stats(x: torch.Tensor) -> torch.Tensor:
    """Stats of a model input: :data:`INPUT_FIELDS` (sums over finite entries, NaN and Inf counts)."""
    x = x.detach().float()
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device))
    nan = torch.isnan(x).sum().float()
    inf = (~finite).sum().float() - nan
    return torch.stack((xf.sum(), (xf * xf).sum(), nan, inf))


def grad_stats(g: torch.Tensor, inv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Stats of a gradient: :data:`GRAD_FIELDS` (sum of squares; NaN/Inf propagate into it).

    ``inv_scale`` (a 1-element tensor, 1 / a loss scaler's scale) unscales the gradient first.
    """
    g = g.detach()
    if g.is_sparse:
        g = g.coalesce().values()
    g = g.float()
    if inv_scale is not None:
        g = g * inv_scale.to(g.device)
    return (g * g).sum().reshape(1)


def fields_for(kind: str) -> tuple[str, ...]:
    """The output-stat layout for an activation kind."""
    return {"relu": DEAD_FIELDS, "bounded": SAT_FIELDS, "softmax": SAT_FIELDS}.get(kind, OUT_FIELDS)
