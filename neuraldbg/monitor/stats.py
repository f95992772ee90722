"""Per-module statistics computed on the device, as pure functions of tensors.

Each function returns 0-d (or, for parameter gradients, 1-d) float tensors and never moves
data to the host: the monitor stacks one step's results into one tensor and transfers it
once. The reductions are chosen for the fewest kernels per output: a sum for every module
(finiteness), a sum of squares (one dot product) for modules owning parameters, one
per-unit ``amax`` instead of the sum for ReLU-like modules (dead units and finiteness from
the same pass) and one comparison for bounded ones (saturation); gradients are L2 norms, squared on the host. Derived
quantities (RMS, mean and std) are computed on the host, by
:mod:`neuraldbg.events.stepstats`.
"""
from __future__ import annotations

import math
import sys

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
#: activation kinds whose outputs carry a third statistic (dead or saturated fraction)
FRACTION_KINDS = ("relu", "bounded", "softmax")

_HALF = (torch.float16, torch.bfloat16)
_DOT = (torch.float32, torch.float64)  # a sum of squares is one dot product


def is_plain(t: torch.Tensor) -> bool:
    """Whether ``t`` (a parameter, a gradient) holds a plain dense tensor: not a tensor subclass
    (``DTensor``, a quantized or wrapper type) whose kernels the statistics do not cover."""
    return type(t.data) is torch.Tensor


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``DTensor`` (an FSDP2 sharded parameter or its gradient) whose local
    shard is a plain dense tensor: the statistics then read that shard (:func:`local`)."""
    # a DTensor exists only once its module is imported: no import (and its cost) otherwise
    mod = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(mod, "DTensor", None)
    if dtensor is None or not isinstance(t, dtensor):
        return False
    return type(getattr(t, "_local_tensor", None)) is torch.Tensor


def measurable(t: torch.Tensor) -> bool:
    """Whether the statistics read ``t``: a plain dense tensor or a sharded one (:func:`is_sharded`).
    Any other tensor subclass stays unmeasured, and the coverage says so
    (``neuraldbg/monitor/measurements/coverage.py``)."""
    return is_plain(t) or is_sharded(t)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor the statistics read: ``t`` itself, or this rank's shard of a ``DTensor``.

    Kernels on a ``DTensor`` would run its sharding propagation, and a reduction over it would
    issue a collective per call (one per hook); the local shard costs nothing to get (no copy,
    no communication). Which readings need the whole tensor and how they get it is said where
    they are read (``neuraldbg/monitor/hooks.py``, ``measurements/weights.py``,
    ``measurements/step_size.py``)."""
    return t._local_tensor.detach() if is_sharded(t) else t


def local_numel(t: torch.Tensor) -> int:
    """Elements of ``t`` this rank holds (all of them for a plain tensor)."""
    return local(t).numel()

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


def _acc(t: torch.Tensor) -> dict:
    # half inputs accumulate in float32 (sums of squares of 300 overflow float16); float64
    # keeps its own precision (torch refuses to narrow it in a reduction)
    return {"dtype": torch.float32} if t.dtype in _HALF else {}


def total(y: torch.Tensor) -> torch.Tensor:
    """Sum of all elements (0-d, float32 accumulation for half inputs)."""
    return y.sum(dtype=torch.float32) if y.dtype in _HALF else y.sum()


def norm(y: torch.Tensor) -> torch.Tensor:
    """L2 norm of all elements (0-d), in one kernel and without a temporary the size of
    ``y``. NaN and Inf propagate into it."""
    return torch.linalg.vector_norm(y, **_acc(y))


def sumsq(y: torch.Tensor) -> torch.Tensor:
    """Sum of squares of all elements (0-d): one dot product for a contiguous float32/64
    tensor, else the square of :func:`norm` (float32 accumulation for half inputs)."""
    if y.dtype in _DOT and y.is_contiguous() and not y.is_meta:
        flat = y.view(-1)
        return torch.dot(flat, flat)
    return norm(y).square()


def unit_count(y: torch.Tensor) -> int:
    """Number of units of an output (see :func:`unit_reduce_dims`)."""
    if y.dim() <= 1:
        return 1
    return int(y.shape[1] if y.dim() >= 4 else y.shape[-1])


def relu_units(y: torch.Tensor) -> torch.Tensor:
    """Per-unit maxima over the batch (1-d) of a ReLU-like output (>= 0): one pass over ``y``.

    The host reads both ReLU statistics from it: its sum is finite exactly when the output is
    (NaN and +Inf propagate into a unit's maximum, and a ReLU-like output has no -Inf), which
    is all that is read of a ReLU's sum; a unit is active when its maximum is not 0 (a NaN
    unit counts as active: its output is not finite, which the detectors read first). The
    dead fraction is ``1 - active / units``.
    """
    if y.dim() == 2:  # (N, F): already one maximum per unit, 1-d
        return y.amax(dim=0)
    return y.amax(dim=unit_reduce_dims(y)).reshape(-1) if y.dim() > 0 else y.reshape(1)


def relu_stats(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of per-unit maxima, active fraction)`` on the device (see :func:`relu_units`),
    for hooks traced by ``torch.compile``, where the host cannot follow unit counts."""
    units = relu_units(y)
    return total(units), torch.count_nonzero(units) / units.numel()


def saturated_fraction(y: torch.Tensor, low: float, high: float, margin: float) -> torch.Tensor:
    """Fraction of elements within ``margin`` (relative to the range) of either bound."""
    y = y.detach()
    y = y.float() if y.dtype in _HALF else y
    eps = margin * (high - low)
    return torch.mean((y <= low + eps) | (y >= high - eps), dtype=torch.float32)


def softmax_saturated_fraction(y: torch.Tensor, dim: int | None, margin: float,
                               logits: torch.Tensor | None = None) -> torch.Tensor:
    """Fraction of softmax rows whose largest probability is within ``margin`` of 1, among
    the rows with at least two open keys: a row with one unmasked key (the first query of
    causal attention) is one-hot by construction, not saturated.

    With the softmax input ``logits`` a key is open when it was not masked: above half the
    dtype's most negative value (masks fill ``-inf`` or ``finfo.min``), so a row collapsed
    so far that the other probabilities underflow to exactly 0 still counts. Without them,
    the non-zero probabilities are the open keys."""
    y = y.detach()
    y = y.float() if y.dtype in _HALF else y
    d = -1 if dim is None else dim
    if logits is not None and logits.shape == y.shape and logits.is_floating_point():
        x = logits.detach()
        open_keys = x > torch.finfo(x.dtype).min / 2
    else:
        open_keys = y != 0
    open_rows = torch.count_nonzero(open_keys, dim=d) >= 2
    hot = (y.amax(dim=d) >= 1.0 - margin) & open_rows
    return torch.count_nonzero(hot).float() / torch.count_nonzero(open_rows).clamp_min(1).float()


def output_stats(y: torch.Tensor, kind: str, *, sq: bool = True, bounds: tuple[float, float] | None = None,
                 softmax_dim: int | None = None, margin: float = 0.01, softmax_margin: float = 0.1,
                 traced: bool = False, x: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Stats of a module output (``y`` must have an element): the sum; the sum of squares
    when ``sq`` (the monitor asks for it on modules that own parameters, whose gradient
    events report the output RMS); then by ``kind`` the saturated fraction (``bounded`` with
    bounds, ``softmax``). A ``relu`` output gives its per-unit maxima instead of the sum
    (1-d, first: :func:`relu_units`), or under ``traced`` (``torch.compile``) the 0-d
    ``(sum of maxima, [sum of squares], active fraction)``. ``x``: the module's input (a
    softmax's logits tell masked keys from underflowed ones)."""
    y = y.detach()
    if kind == "relu":
        if traced:
            finite, active = relu_stats(y)
            return (finite, sumsq(y), active) if sq else (finite, active)
        return (relu_units(y), sumsq(y)) if sq else (relu_units(y),)
    out = (total(y), sumsq(y)) if sq else (total(y),)
    if kind == "bounded":
        if bounds is None:  # a bounded kind always has bounds (bounds_of); guard the layout
            raise ValueError("bounded output statistics need the bounds")
        return out + (saturated_fraction(y, bounds[0], bounds[1], margin),)
    if kind == "softmax":
        return out + (softmax_saturated_fraction(y, softmax_dim, softmax_margin, x),)
    return out


def batchable(ys: list[torch.Tensor], kind: str) -> bool:
    """Whether :func:`batched_output_blocks` applies: two outputs or more, a ReLU's of two dims
    or more (one unit per output below that)."""
    return len(ys) > 1 and not (kind == "relu" and ys[0].dim() <= 1)


def batched_output_blocks(ys: list[torch.Tensor], kind: str, *,
                          sq: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The statistics of :func:`output_stats` of several outputs of one shape, dtype and device
    (``kind`` 'plain' or 'relu'; :func:`batchable`), stacked and reduced together, as two flat
    runs in the outputs' order, ``(scalars, maxima)``: for 'plain' each output's sum and [sum of
    squares] one after the other, and None; for 'relu' each output's sum of squares (None
    without ``sq``), and each output's per-unit maxima one after the other. The host reads them
    where it would read the outputs' tuples, with no tensor made per output. The values are
    those of :func:`output_stats` (sums and maxima exact, sums of squares to rounding)."""
    if kind not in ("plain", "relu"):
        raise ValueError(f"batched output statistics cover the kinds 'plain' and 'relu', not {kind!r}")
    k = len(ys)
    with torch.no_grad():  # the stack is then outside the graph: no detach per output
        st = torch.stack(ys)
        flat = st.view(k, -1)
        acc = _acc(ys[0])
        sqs = torch.linalg.vector_norm(flat, dim=1, **acc).square() if sq else None
        if kind == "relu":  # per-unit maxima (relu_units), one row per output
            return sqs, st.amax(dim=tuple(d + 1 for d in unit_reduce_dims(ys[0]))).reshape(-1)
        sums = flat.sum(dim=1, **acc)
        return (torch.stack((sums, sqs), dim=1).reshape(-1) if sq else sums), None


def input_stats(x: torch.Tensor, host_check: bool | None = None) -> tuple[torch.Tensor, ...]:
    """0-d stats of a model input: ``(sum, norm, finite count, non-NaN count)``.

    The sums run over every entry, so they are only meaningful when every entry is finite
    (the host reads the counts first). On the CPU a finite norm proves every entry finite (NaN
    and Inf propagate into it; a sum over finite entries may still overflow, and the counts of
    such an input are its element count either way), and reading a CPU scalar costs no device
    sync, so the counts (``isnan``/``isfinite``: slow CPU kernels) are only computed for an
    input that is not finite. ``host_check`` forces one path (default: that one for CPU
    tensors outside ``torch.compile``, where a scalar read would break the graph).
    """
    x = x.detach()
    s, nr = total(x), norm(x)
    if host_check is None:
        host_check = x.is_cpu and not torch.compiler.is_compiling()
    if host_check and math.isfinite(float(nr)):
        return s, nr, *_count_pair(float(x.numel()), s.dtype)
    return s, nr, torch.isfinite(x).sum(dtype=s.dtype), torch.isnan(x).logical_not_().sum(dtype=s.dtype)


_counts: tuple = (None, None)  # the last (key, pair) of _count_pair, swapped whole (threads)


def _count_pair(n: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, n)`` as one 0-d CPU tensor of ``dtype``, kept for the next input of the same size:
    a loop feeds one batch shape, and a tensor made per step costs an allocation and a kernel
    (readers only stack it, never write it)."""
    global _counts
    key, pair = _counts
    if key != (n, dtype):
        t = torch.full((), n, dtype=dtype)
        pair = (t, t)
        _counts = ((n, dtype), pair)
    return pair


def grad_norm(g: torch.Tensor) -> torch.Tensor:
    """L2 norm (0-d) of one gradient, sparse or dense; NaN and Inf propagate into it."""
    g = g.detach()
    if g.is_sparse:
        g = g.coalesce().values()
    return norm(g)


def grad_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norms of many gradients (or the weights the update check reads) as one 1-d float
    tensor: one ``torch._foreach_norm`` accumulated in float32 when they are dense on one device
    and none is float64 (the common case), else one norm per tensor (float64 in its own precision)."""
    try:
        return torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))
    except (RuntimeError, NotImplementedError, TypeError):
        # sparse gradients, float64 ones (no narrowing) or several devices
        dev = grads[0].device
        return torch.stack([grad_norm(g).to(dev) for g in grads])


#: gradients up to this many elements are stacked by shape and measured together: copying a
#: small tensor costs less than one more kernel launch for it
SMALL = 4096
#: the fewest gradients of one shape stacked together: a stack costs a copy and two more kernels
#: (the stack, the concatenation after), which a few launches saved do not repay (an MLP's two
#: bias vectors of one width measured 45 us more per checked step stacked than in the foreach norm)
GROUP_MIN = 8


def norm_plan(grads: list[torch.Tensor], group_min: int = GROUP_MIN) -> tuple[tuple[tuple[int, ...], ...],
                                                                              tuple[int, ...]]:
    """``(groups, rest)``: positions in ``grads`` for :func:`planned_norms`. A group holds the
    small dense gradients of one (shape, dtype, device) that occurs at least ``group_min``
    times; the rest go to :func:`grad_norms` together."""
    groups: dict[tuple, list[int]] = {}
    rest: list[int] = []
    for i, g in enumerate(grads):
        if g.numel() <= SMALL and g.dim() > 0 and not g.is_sparse and g.dtype in (torch.float32, *_HALF):
            groups.setdefault((tuple(g.shape), g.dtype, g.device), []).append(i)
        else:
            rest.append(i)
    rest += [i for v in groups.values() if len(v) < group_min for i in v]
    return tuple(tuple(v) for v in groups.values() if len(v) >= group_min), tuple(rest)


def planned_norms(grads: list[torch.Tensor], plan) -> torch.Tensor:
    """Norms of ``grads`` in the order of ``plan``'s positions (groups, then the rest; see
    :func:`norm_plan`): each group of same-shaped small gradients is stacked and reduced in
    one kernel, so thousands of small layers cost a few kernels, not thousands."""
    groups, rest = plan
    parts = []
    for pos in groups:
        stacked = torch.stack([grads[i] for i in pos])
        parts.append(torch.linalg.vector_norm(stacked, dim=tuple(range(1, stacked.dim())), dtype=torch.float32))
    if rest:
        parts.append(grad_norms([grads[i] for i in rest]))
    return parts[0] if len(parts) == 1 else torch.cat(parts)
