"""The host side of the transfer: a queued step read back from the flat host array into per-layer
numpy columns (:class:`~neuraldbg.events.stepstats.StepStats`).

:class:`Layout` is compiled once per distinct step structure (the sequence of record slots,
the losses, the scale) and says where each statistic sits in the flat vector; :func:`to_stepstats`
reads one step with it, :func:`read_run` consecutive steps of one structure at once (each numpy
operation once for all of them, the same values). The device side (packing, queueing, the one copy) is
:mod:`neuraldbg.monitor.transfer`.
"""
from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Callable

import numpy as np

from neuraldbg.events.stepstats import StepStats
from neuraldbg.monitor import stats as S
from neuraldbg.monitor.records import EMPTY, INPUT, OUT

if TYPE_CHECKING:  # pragma: no cover
    from neuraldbg.monitor.records import Tables
    from neuraldbg.monitor.transfer import _Pending

#: distinct step layouts (and parameter batches) kept compiled (a loop repeats a few; dynamic
#: models may not)
MAX_LAYOUTS = 64


class Layout:
    """Where each statistic of one step structure sits in the flat vector, as numpy indices.

    Scalars come first (``size`` of them: records, losses, scale), then the per-unit maxima of
    ReLU-like outputs (``relu_len``), from which the host derives each ReLU's sum of maxima
    and active count (placed after the scalars, so one index reads any statistic; the index
    after them stands for "absent", read as NaN). Each layer's output statistics are then
    gathered with one index array (``gather``: sum, sum of squares, dead and saturated
    fraction); a module called several times in a step (shared) is summed with ``bincount``.
    """

    def __init__(self, tables: "Tables", slots: tuple[int, ...], n_loss: int, has_scale: bool) -> None:
        self.names = tuple(tables.names)
        L = self.L = len(self.names)
        self.param_layer = np.asarray(tables.param_layer, dtype=np.intp)
        self.param_numel = np.asarray(tables.param_numel, dtype=np.float64)
        cols: dict[str, list] = {k: [] for k in ("out_k", "out_layer", "out_pos", "sq_pos", "frac_pos",
                                                 "frac_dead", "frac_units", "in_k", "in_pos", "in_layer",
                                                 "empty_layer")}
        vec_records, vec_units, vec_val = [], [], []   # per-unit maxima: which records, how long
        pos = val = 0   # position among the scalars, index among the flattened record values
        for k, slot in enumerate(slots):
            group, layer, kind, sq, units = tables.slots[slot]
            if group == OUT:  # sum, [sum of squares], [active or saturated fraction]
                cols["out_k"].append(k)
                cols["out_layer"].append(layer)
                vector = kind == "relu" and units > 0
                if vector:  # sum and active count derived on the host, positions set below
                    vec_records.append(len(cols["out_pos"]))
                    vec_units.append(units)
                    vec_val.append(val)
                    cols["out_pos"].append(-1)
                    cols["sq_pos"].append(pos if sq else -1)
                    pos += sq
                    cols["frac_pos"].append(-1)
                    val += 1 + sq
                else:
                    cols["out_pos"].append(pos)
                    cols["sq_pos"].append(pos + 1 if sq else -1)
                    pos += 2 if sq else 1
                    has_frac = kind in S.FRACTION_KINDS
                    cols["frac_pos"].append(pos if has_frac else -1)
                    pos += has_frac
                    val += (2 if sq else 1) + has_frac
                cols["frac_dead"].append(kind == "relu")
                cols["frac_units"].append(max(units, 1))
            elif group == INPUT:
                cols["in_k"].append(k)
                cols["in_pos"].append(pos)
                cols["in_layer"].append(layer)  # -1: the root's input; else a sub-network's entry
                pos += 4
                val += 4
            elif group == EMPTY:
                cols["empty_layer"].append(layer)
        self.loss_pos = np.arange(pos, pos + n_loss)
        pos += n_loss
        self.scale_pos = pos if has_scale else None
        self.size = pos + (1 if has_scale else 0)
        for j, r in enumerate(vec_records):  # derived values follow the scalars
            cols["out_pos"][r] = self.size + 2 * j
            cols["frac_pos"][r] = self.size + 2 * j + 1
        self.absent = self.size + 2 * len(vec_records)
        self.relu_starts = np.cumsum([0] + vec_units[:-1]).astype(np.intp)
        self.relu_len = int(sum(vec_units))
        # which flattened record values are 1-d per-unit maxima (to the vector part)
        vec_set = set(vec_val)
        self.pick_vectors = _picker(vec_val)
        self.pick_scalars = _picker([i for i in range(val) if i not in vec_set]) if vec_val else None
        for name, v in cols.items():
            setattr(self, name, np.asarray(v, dtype=bool if name == "frac_dead" else np.intp))
        self.frac_units = self.frac_units.astype(np.float64)  # a ReLU's active count is divided by it
        self.n_records = len(slots)
        self.has_out = np.zeros(L, dtype=bool)
        self.has_out[self.out_layer] = True
        self.shared = len(self.out_layer) > int(self.has_out.sum())
        self.gather = np.full((L, 4), self.absent, dtype=np.intp)  # sum, sum of squares, active, saturated
        self.n_at = np.full(L, self.n_records, dtype=np.intp)     # record of the output's element count
        if not self.shared:
            fp = self.frac_pos
            self.gather[self.out_layer, 0] = self.out_pos
            self.gather[self.out_layer, 1] = np.where(self.sq_pos >= 0, self.sq_pos, self.absent)
            self.gather[self.out_layer, 2] = np.where((fp >= 0) & self.frac_dead, fp, self.absent)
            self.gather[self.out_layer, 3] = np.where((fp >= 0) & ~self.frac_dead, fp, self.absent)
            self.n_at[self.out_layer] = self.out_k
        self.units = np.ones(L)
        self.units[self.out_layer] = self.frac_units
        # a module that only saw empty inputs this step: its (zero) gradients are no observation
        self.empty_only = np.zeros(L, dtype=bool)
        self.empty_only[self.empty_layer] = True
        self.empty_only &= ~self.has_out
        self.any_empty = bool(self.empty_only.any())
        self.has_out.flags.writeable = False  # shared by every step read with this layout


def _picker(idx: list[int]) -> Callable[[list], list]:
    """``values -> [values[i] for i in idx]`` at C speed."""
    if not idx:
        return lambda values: []
    get = itemgetter(*idx)
    return (lambda values: [get(values)]) if len(idx) == 1 else (lambda values: list(get(values)))


_F32_MAX = float(np.finfo(np.float32).max)


def _sq32(norms: np.ndarray) -> np.ndarray:
    """Squares of norms in float32 (the sums of squares the device would hold: beyond its
    range inf, below it 0, so gradients that underflow read as exactly zero, as they always
    did). Call under ``np.errstate(all="ignore")``."""
    return np.square(norms).astype(np.float32).astype(np.float64)


def _per_layer(layer: np.ndarray, values: np.ndarray, L: int) -> np.ndarray:
    return np.bincount(layer, weights=values, minlength=L) if len(layer) else np.zeros(L)


def read_loss(p: "_Pending", host: np.ndarray, z0: int, lay: "Layout | None") -> float | None:
    """The step's loss: the mean of its float losses and of the device losses' float32 mean."""
    loss_vals = list(p.floats)
    k = len(p.tensors)
    if k:
        at = z0 + (lay.loss_pos[0] if lay is not None else 0)
        v = host[at:at + k].astype(np.float32)  # a loss is read in float32, as it always was
        loss_vals.append(float(v[0]) if k == 1 else float(v.mean(dtype=np.float32)))
    if not loss_vals:
        return None
    return loss_vals[0] if len(loss_vals) == 1 else sum(loss_vals) / len(loss_vals)


def to_stepstats(step: int, where: tuple, host: np.ndarray, loss: float | None, has_bwd: bool) -> StepStats:
    """One queued step read from the host array; ``where`` is ``(queued step, layout, offset
    of its scalars, offset of its vectors, parameter-batch cache)``. Consecutive steps of one
    :func:`run_key` are read together by :func:`read_run` instead."""
    p, lay, z0, vec_at, cache = where
    if lay is None:
        st = StepStats(step=step, loss=loss, has_backward=has_bwd)
    else:
        with np.errstate(all="ignore"):
            st = _read(step, p, lay, host, z0, vec_at, cache, loss, has_bwd)
    return _noted(st, p)


def run_key(p: "_Pending") -> tuple | None:
    """What consecutive queued steps share to be read together by :func:`read_run`: one layout
    (not a shared module's, no empty inputs) and the parameters of one backward pass (a loop
    repeats one tuple of them: two keys compare by identity); ``None`` for a step read alone
    (:func:`to_stepstats`)."""
    lay = p.lay
    if lay is None or lay.shared or lay.any_empty or len(p.pgrad) != 1 or p.n_scalars != lay.size:
        return None
    idx = p.pgrad[0][0]
    return (lay, idx) if p.n_vectors == lay.relu_len + len(idx) else None


def read_run(run: list, host: np.ndarray, z0: int, vec_at: int, cache: dict,
             losses: list[float | None]) -> list[StepStats]:
    """Consecutive queued steps of one :func:`run_key`, their scalars one step after the other
    from ``z0`` in ``host`` and their vectors from ``vec_at``, read with one numpy operation per
    statistic for all of them (one step at a time, each operation ran once per step: at
    every=1 that reading was a few percent of a small model's step); ``losses``: each step's
    (:func:`read_loss`). The values are those :func:`to_stepstats` reads, bit for bit: the same
    elementwise operations, and each layer's gradient sum added in the same order."""
    lay: Layout = run[0].lay
    k, L, size = len(run), lay.L, lay.size
    gl, n, has = _batch(run[0].pgrad[0][0], lay, cache)
    width = lay.relu_len + len(gl)
    with np.errstate(all="ignore"):
        v = host[vec_at:vec_at + k * width].reshape(k, width)
        h = _with_derived(host[z0:z0 + k * size].reshape(k, size), v, lay)
        ns = np.array([p.ns for p in run], dtype=np.float64)
        cols = _out_columns(h, ns, lay)
        x = v[:, lay.relu_len:]
        scales = h[:, lay.scale_pos] if lay.scale_pos is not None else None
        if scales is not None:  # a scale of 0 leaves the norms as they are (x / 1.0 is x)
            x = x / np.where(scales != 0, scales, 1.0)[:, None]
        # one bincount for every step: step r's layers are bins r * L.., each summed in the
        # order of its parameters, as one step's bincount sums them
        bins = (gl + L * np.arange(k)[:, None]).ravel()
        sums = np.bincount(bins, weights=_sq32(x).ravel(), minlength=k * L).reshape(k, L)
        cols["pgrad_sumsq"] = np.where(has, sums, np.nan)
        out = []
        for r, p in enumerate(run):
            row = {c: col[r] for c, col in cols.items()}
            row["pgrad_n"] = n
            st = StepStats(step=p.step, loss=losses[r], inputs=_inputs(h[r], ns[r], lay), has_backward=p.has_bwd,
                           grad_scale=None if scales is None else float(scales[r]), names=lay.names,
                           columns=row, present=(lay.has_out, has))
            out.append(_noted(st, p))
    return out


def _noted(st: StepStats, p: "_Pending") -> StepStats:
    """``st`` with the layers that ran under ``no_grad`` in its step named."""
    if p.ran_without_grad:
        names = p.tables.names
        st.ran_without_grad = tuple(names[i] for i in sorted(p.ran_without_grad))
    return st


def _name_entry(inputs: dict, lay: "Layout", finite: np.ndarray, n: np.ndarray) -> None:
    """Name in ``inputs["layer"]`` the first layer of the first sub-network whose input (one
    per input record: finite count, element count) was not finite; the root's input (layer
    -1) names none. Read only for a step whose input was not finite."""
    bad = np.flatnonzero((finite < n) & (lay.in_layer >= 0))
    if len(bad):
        inputs["layer"] = lay.names[int(lay.in_layer[bad[0]])]


def _with_derived(s: np.ndarray, v: np.ndarray, lay: "Layout") -> np.ndarray:
    """Rows of scalars ``s`` (steps x ``lay.size``), then each ReLU's sum of maxima and active
    count from the rows of vectors ``v`` (its maxima first), then the "absent" NaN: one row per
    step that ``lay``'s positions index."""
    k = len(s)
    absent = np.full((k, 1), np.nan)
    if not lay.relu_len:
        return np.concatenate([s, absent], axis=1)
    m = v[:, :lay.relu_len]
    derived = np.empty((k, 2 * len(lay.relu_starts)))
    derived[:, 0::2] = np.add.reduceat(m, lay.relu_starts, axis=1)
    derived[:, 1::2] = np.add.reduceat((m != 0).astype(np.float64), lay.relu_starts, axis=1)
    return np.concatenate([s, derived, absent], axis=1)


def _out_columns(h: np.ndarray, ns: np.ndarray, lay: "Layout") -> dict[str, np.ndarray]:
    """The output columns of a layout without shared modules, from one step's ``h`` and element
    counts ``ns`` (1-d) or from rows of them (one per step)."""
    g = h[..., lay.gather]
    return {"out_sum": g[..., 0], "out_sumsq": g[..., 1], "dead_frac": 1.0 - g[..., 2] / lay.units,
            "sat_frac": g[..., 3], "out_n": ns[..., lay.n_at]}


def _inputs(h: np.ndarray, ns: np.ndarray, lay: "Layout") -> dict | None:
    """The model input's sums and counts of one step (``None``: no input recorded)."""
    if len(lay.in_pos) == 1:  # (sum, norm, finite count, non-NaN count) of the input tensor
        i = int(lay.in_pos[0])
        s_, nr, fin, not_nan = h[i:i + 4].tolist()
        n_in = float(ns[lay.in_k[0]])
        sq = nr * nr
        inputs = {"sum": s_, "sumsq": np.inf if sq > _F32_MAX else sq, "nan": n_in - not_nan,
                  "inf": (n_in - fin) - (n_in - not_nan), "n": n_in}
        if fin < n_in:
            _name_entry(inputs, lay, np.array([fin]), np.array([n_in]))
        return inputs
    if not len(lay.in_pos):
        return None
    # several input tensors: their sums and counts add up
    v = h[lay.in_pos[:, None] + np.arange(4)]
    n_in = ns[lay.in_k]
    nan_n = float((n_in - v[:, 3]).sum())
    inputs = {"sum": float(v[:, 0].sum()), "sumsq": float(_sq32(v[:, 1]).sum()), "nan": nan_n,
              "inf": float((n_in - v[:, 2]).sum()) - nan_n, "n": float(n_in.sum())}
    if inputs["nan"] + inputs["inf"] > 0:
        _name_entry(inputs, lay, v[:, 2], n_in)
    return inputs


def _read(step, p, lay, host, z0, vec_at, cache, loss, has_bwd) -> StepStats:
    h = _with_derived(host[None, z0:z0 + lay.size], host[None, vec_at:vec_at + lay.relu_len], lay)[0]
    vec_at += lay.relu_len
    ns = np.array(p.ns, dtype=np.float64)
    scale = float(h[lay.scale_pos]) if lay.scale_pos is not None else None
    if not lay.shared:
        cols = _out_columns(h, ns, lay)
    else:  # a shared module: sums add up over its calls, fractions are the mean of its calls
        L = lay.L
        ol, op, sp = lay.out_layer, lay.out_pos, lay.sq_pos
        cols = {"out_sum": np.where(lay.has_out, _per_layer(ol, h[op], L), np.nan),
                "out_sumsq": np.where(np.bincount(ol[sp >= 0], minlength=L) > 0,
                                      _per_layer(ol[sp >= 0], h[sp[sp >= 0]], L), np.nan),
                "out_n": _per_layer(ol, ns[lay.out_k], L)}
        for col, dead in (("dead_frac", True), ("sat_frac", False)):
            m = (lay.frac_pos >= 0) & (lay.frac_dead == dead)
            c = np.bincount(ol[m], minlength=L)
            v = 1.0 - h[lay.frac_pos[m]] / lay.frac_units[m] if dead else h[lay.frac_pos[m]]
            cols[col] = np.where(c > 0, _per_layer(ol[m], v, L) / np.maximum(c, 1), np.nan)
    has_pgrad = _read_pgrad(p, lay, host, vec_at, cache, scale, cols)
    return StepStats(step=step, loss=loss, inputs=_inputs(h, ns, lay), has_backward=has_bwd, grad_scale=scale,
                     names=lay.names, columns=cols, present=(lay.has_out, has_pgrad))


def _batch(idx: tuple, lay: "Layout", cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the parameters ``idx`` of one backward pass under ``lay``: each one's layer, each
    layer's element count, and which layers have any (kept in ``cache``)."""
    key = (lay.L, len(lay.param_layer), idx)
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= MAX_LAYOUTS:
            cache.clear()
        ii = np.asarray(idx, dtype=np.intp)
        gl = lay.param_layer[ii]
        hit = cache[key] = (gl, np.bincount(gl, weights=lay.param_numel[ii], minlength=lay.L),
                            np.bincount(gl, minlength=lay.L) > 0)
    return hit


def _read_pgrad(p, lay, host, vec_at, cache, scale, cols) -> np.ndarray:
    """Per-layer parameter-gradient columns into ``cols``; returns the presence flags."""
    L, P = lay.L, len(lay.param_layer)
    if len(p.pgrad) == 1 and not lay.any_empty:  # one backward pass: the common step
        gl, n, has = _batch(p.pgrad[0][0], lay, cache)
        g = host[vec_at:vec_at + len(gl)]
        g = g / scale if scale else g
        cols["pgrad_sumsq"] = np.where(has, np.bincount(gl, weights=_sq32(g), minlength=L), np.nan)
        cols["pgrad_n"] = n
        return has
    # several backward passes (accumulation, a GAN's two losses): the last wins per parameter
    gvals = np.full(P, np.nan)
    fired = np.zeros(P, dtype=bool)
    for idx, v in p.pgrad:
        m = v.numel()
        ii = np.asarray(idx, dtype=np.intp)
        gvals[ii] = host[vec_at:vec_at + m]
        fired[ii] = True
        vec_at += m
    if lay.any_empty:
        fired &= ~lay.empty_only[lay.param_layer]
    gl = lay.param_layer[fired]
    has = (np.bincount(gl, minlength=L) if len(gl) else np.zeros(L)) > 0
    g = gvals[fired] / scale if scale else gvals[fired]
    cols["pgrad_sumsq"] = np.where(has, _per_layer(gl, _sq32(g), L), np.nan)
    cols["pgrad_n"] = _per_layer(gl, lay.param_numel[fired], L)
    return has
