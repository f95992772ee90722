"""Host-side statistics of one checked step: what detectors read.

The monitor transfers per-layer sums computed on the device; derived quantities (RMS, mean
and std) are computed here from those sums, so that detectors never need torch. A step's
per-layer numbers are numpy *columns* over one tuple of layer names (``names``): detectors
work on whole columns, never a Python loop over layers. A layer that was not observed in a
step (its module did not run, or ran on zero elements) is *missing*: NaN, with its presence
flag off, never zero. ``layers`` gives the same numbers as a dict per layer.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

#: the per-layer columns of a step
COLUMNS = ("out_sum", "out_sumsq", "out_n", "dead_frac", "sat_frac", "pgrad_sumsq", "pgrad_n")
_GROUPS = (("out", ("out_sum", "out_sumsq", "out_n")), ("pgrad", ("pgrad_sumsq", "pgrad_n")))


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


def rms_column(sumsq: np.ndarray, n: np.ndarray, present: np.ndarray) -> np.ndarray:
    """:func:`rms` over columns: NaN where absent, ``n <= 0`` or ``sumsq`` is not >= 0."""
    ok = present & (n > 0) & (sumsq >= 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, np.sqrt(np.where(ok, sumsq, 0.0) / np.where(ok, n, 1.0)), np.nan)


class StepStats:
    """Numbers for one step.

    Per layer (columns over ``names``): ``out_sum``, ``out_sumsq``, ``out_n`` (the module's
    output), ``dead_frac`` / ``sat_frac`` (activation modules only), ``pgrad_sumsq`` /
    ``pgrad_n`` (parameter gradients); ``has_out`` and ``has_pgrad`` say which are observed.
    ``inputs`` holds the model input's ``sum``, ``sumsq``, ``nan``, ``inf``, ``n`` (the sums
    are over all entries, meaningful when ``nan`` and ``inf`` are 0).

    Build it from ``layers`` (a dict per layer with any of those keys, as tests and custom
    callers do) or from ready columns (``names``, ``columns``, ``present``, as the monitor does).
    ``ran_without_grad`` names the layers whose training-mode forward ran under ``no_grad``
    in this step (they ran, cut from the loss; no statistics are taken there).
    """

    #: layers whose training-mode forward ran under ``torch.no_grad()`` this step
    ran_without_grad: tuple[str, ...] = ()
    #: the primary optimizer's learning rate at this step (largest over its param groups;
    #: ``None``: unknown -- no optimizer found, or a tensor rate, which is not read to avoid a sync)
    lr: float | None = None

    def __init__(self, step: int, loss: float | None = None, inputs: dict[str, float] | None = None,
                 layers: dict[str, dict[str, float]] | None = None, has_backward: bool = False,
                 grad_scale: float | None = None, *, names: tuple[str, ...] | None = None,
                 columns: dict[str, np.ndarray] | None = None,
                 present: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.step = step
        self.loss = loss
        self.inputs = inputs
        self.has_backward = has_backward
        #: the GradScaler scale in force during this step's backward (``None``: no scaler);
        #: gradient sums of squares here are already divided by its square
        self.grad_scale = grad_scale
        self._layers = layers
        if columns is None:
            names, columns, present = _from_layers(layers) if layers else _EMPTY
        self.names: tuple[str, ...] = names
        self.cols = columns
        self.has_out, self.has_pgrad = present

    def __getattr__(self, name: str) -> np.ndarray:
        cols = self.__dict__.get("cols")
        if cols is not None and name in cols:
            return cols[name]
        raise AttributeError(f"StepStats has no attribute {name!r}")

    @property
    def layers(self) -> dict[str, dict[str, float]]:
        """The observed numbers as ``{layer: {stat: value}}`` (missing layers and stats left out)."""
        if self._layers is None:
            self._layers = _to_layers(self)
        return self._layers

    @property
    def n_layers_seen(self) -> int:
        """Layers with any observation this step."""
        return int(np.count_nonzero(self.has_out | self.has_pgrad))

    def out_rms_column(self) -> np.ndarray:
        """Output RMS per layer (NaN where not observed or not finite)."""
        c = self.cols
        return rms_column(c["out_sumsq"], c["out_n"], self.has_out & np.isfinite(c["out_sumsq"]))

    def outputs_finite(self) -> bool:
        """Whether every output observed this step has a finite sum."""
        return not (self.has_out & ~np.isfinite(self.cols["out_sum"])).any()

    def _nonfinite_grads(self) -> np.ndarray:
        return self.has_pgrad & (self.cols["pgrad_n"] > 0) & ~np.isfinite(self.cols["pgrad_sumsq"])

    def grads_finite(self) -> bool:
        """Whether every parameter-gradient sum of squares observed this step is finite (no
        list of names made: most steps)."""
        return not self._nonfinite_grads().any()

    def nonfinite_grad_layers(self) -> list[str]:
        """Layers whose parameter-gradient sum of squares is NaN or Inf this step."""
        return [self.names[i] for i in np.flatnonzero(self._nonfinite_grads())]

    def grad_rms(self, layer: str) -> float | None:
        """RMS of the layer's parameter gradients, ``None`` when it has none this step."""
        d = self.layers.get(layer)
        if not d or d.get("pgrad_n", 0) <= 0:
            return None
        return rms(d["pgrad_sumsq"], d["pgrad_n"])

    def input_mean_std(self) -> tuple[float, float] | None:
        """Mean and std of the model input (``None`` when it has NaN or Inf entries: the
        monitor's sums then run over non-finite values)."""
        if not self.inputs or self.inputs.get("n", 0) <= 0:
            return None
        if self.inputs.get("nan", 0) > 0 or self.inputs.get("inf", 0) > 0:
            return None
        n = self.inputs["n"] - self.inputs.get("nan", 0) - self.inputs.get("inf", 0)
        return mean_std(self.inputs["sum"], self.inputs["sumsq"], n)


def _from_layers(layers: dict[str, dict[str, float]]):
    names = tuple(layers)
    L = len(names)
    cols = {c: np.full(L, 0.0 if c.endswith("_n") else np.nan) for c in COLUMNS}
    present = [np.zeros(L, dtype=bool) for _ in _GROUPS]
    for i, d in enumerate(layers.values()):
        for k, v in d.items():
            if k in cols:
                cols[k][i] = v
        for flag, (_, keys) in zip(present, _GROUPS):
            flag[i] = any(k in d for k in keys)
    return names, cols, tuple(present)


#: the columns of a step without layer observations (a loss-only step), shared: read-only
_EMPTY = _from_layers({})
for _c in (*_EMPTY[1].values(), *_EMPTY[2]):
    _c.flags.writeable = False


def _to_layers(st: StepStats) -> dict[str, dict[str, float]]:
    flags = dict(zip(("out", "pgrad"), (st.has_out, st.has_pgrad)))
    seen = np.flatnonzero(st.has_out | st.has_pgrad)
    out: dict[str, dict[str, float]] = {}
    for i in seen:
        d: dict[str, float] = {}
        for group, keys in _GROUPS:
            if flags[group][i]:
                # an output without a sum of squares (a module owning no parameters) omits it
                d.update((k, float(st.cols[k][i])) for k in keys if k != "out_sumsq" or not math.isnan(st.cols[k][i]))
                if group == "out":
                    for k in ("dead_frac", "sat_frac"):
                        if not math.isnan(st.cols[k][i]):
                            d[k] = float(st.cols[k][i])
        out[st.names[i]] = d
    return out


class LayerIndex:
    """Positions of layer names in a detector's own growing per-layer arrays.

    Steps share a few ``names`` tuples (the monitor's: one per step structure, several where a
    large model's outputs are read in rotating shares), so :meth:`of` is a cached lookup per
    tuple; a new tuple is mapped once, by name, new names getting new positions (a position never
    changes, so a cached mapping stays right).
    """

    #: name tuples whose positions are kept (a loop repeats a few structures)
    KEEP = 16

    def __init__(self) -> None:
        self.pos: dict[str, int] = {}
        self._cache: dict[int, tuple[tuple[str, ...], np.ndarray]] = {}  # id(names) -> (names, positions)

    def __len__(self) -> int:
        return len(self.pos)

    def of(self, names: tuple[str, ...]) -> np.ndarray:
        """Positions (intp array) of ``names``."""
        got = self._cache.get(id(names))
        if got is not None and got[0] is names:  # the tuple itself is held: its id is not reused
            return got[1]
        pos = self.pos
        idx = np.fromiter((pos.setdefault(n, len(pos)) for n in names), dtype=np.intp, count=len(names))
        if len(self._cache) >= self.KEEP:
            self._cache.clear()
        self._cache[id(names)] = (names, idx)
        return idx

    def get(self, name: str) -> int | None:
        """The position of ``name`` (None when never seen)."""
        return self.pos.get(name)


def grown(arr: np.ndarray, n: int, fill: Any) -> np.ndarray:
    """``arr`` extended to length ``n`` along its first axis with ``fill`` (itself when long enough)."""
    if len(arr) >= n:
        return arr
    extra = np.full((n - len(arr),) + arr.shape[1:], fill, dtype=arr.dtype)
    return np.concatenate([arr, extra])
