"""Gradient health: vanishing and exploding parameter gradients, per layer.

The criteria are written once, over numpy columns of all layers of a step
(:func:`vanishing_mask`, :func:`exploding_growth`); the dict functions are their per-layer
views for callers holding a few named values.
"""
from __future__ import annotations

import math

import numpy as np

from neuraldbg.events.base import GRADIENT, Event, make_event, make_events
from neuraldbg.events.registry import Detector, register_detector
from neuraldbg.events.stepstats import LayerIndex, StepStats, grown


def vanishing_mask(r: np.ndarray, abs_floor: float, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """``(mask, ratio to the largest)`` of layers whose finite RMS ``r`` is below ``abs_floor``
    or below ``ratio`` x the largest finite RMS (the relative test needs two layers)."""
    fin = np.isfinite(r)
    if not fin.any():
        return np.zeros(len(r), dtype=bool), np.full(len(r), np.nan)
    top = r[fin].max()
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = r / top if top > 0 else np.zeros(len(r))
    many = np.count_nonzero(fin) > 1
    return fin & ((r < abs_floor) | (many & (rel < ratio))), rel


def exploding_growth(r: np.ndarray, base: np.ndarray, *, abs_ceiling: float, rel: float, ratio: float,
                     floor: float) -> np.ndarray:
    """Growth factor per layer where the gradient RMS ``r`` exploded, NaN elsewhere.

    Exploded: infinite (growth inf), above ``abs_ceiling``, or grown ``rel`` x over its own
    baseline ``base`` (NaN: none). Growth is only trusted where the baseline is above
    ``floor`` (a vanished baseline makes every ratio huge). A layer ``ratio`` x above the
    smallest layer counts only when it also grew half of ``rel`` over its own baseline, so
    that a healthy spread across layers never fires. NaN RMS belongs to the data detector.
    """
    pos = np.isfinite(r) & (r > 0)
    low = r[pos].min() if pos.any() else 0.0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        trusted = np.isfinite(base) & (base > floor)
        growth = np.where(trusted, r / np.where(trusted, base, 1.0), np.nan)
        has_g = ~np.isnan(growth)
        above = r > abs_ceiling
        spread = has_g & (growth > rel / 2) & (low > 0) & (r / (low if low > 0 else 1.0) > ratio)
        fires = ~np.isnan(r) & (np.isinf(r) | above | (has_g & (growth > rel)) | spread)
        value = np.where(np.isinf(r), np.inf, np.where(above & ~has_g, r / abs_ceiling, growth))
    return np.where(fires, value, np.nan)


def lr_allowance(lr: float | None, base_lr: np.ndarray) -> np.ndarray:
    """How much of a layer's gradient growth its learning rate explains: ``lr / base_lr`` where
    the rate has risen since the baseline (``base_lr``: the median rate of its warm-up checks,
    NaN when unknown), 1 elsewhere. A warm-up that takes the rate 8x up allows 8x more growth
    before the relative exploding test fires; a rate that falls allows nothing more."""
    if lr is None or not math.isfinite(lr) or lr <= 0:
        return np.ones(len(base_lr))
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = np.isfinite(base_lr) & (base_lr > 0)
        return np.where(ok, np.maximum(1.0, lr / np.where(ok, base_lr, 1.0)), 1.0)


def vanishing_layers(rms_by_layer: dict[str, float], abs_floor: float, ratio: float) -> dict[str, float]:
    """Layers whose gradient RMS is below ``abs_floor`` or below ``ratio`` x the largest layer's;
    layer -> ratio to the largest RMS (see :func:`vanishing_mask`)."""
    names = list(rms_by_layer)
    mask, rel = vanishing_mask(np.array([rms_by_layer[n] for n in names], dtype=float), abs_floor, ratio)
    return {names[i]: float(rel[i]) for i in np.flatnonzero(mask)}


def exploding_layers(rms_by_layer: dict[str, float], baselines: dict[str, float], *, abs_ceiling: float,
                     rel: float, ratio: float, floor: float) -> dict[str, float]:
    """Layers whose gradient RMS exploded; layer -> growth factor (inf for infinite gradients;
    see :func:`exploding_growth`)."""
    names = list(rms_by_layer)
    r = np.array([rms_by_layer[n] for n in names], dtype=float)
    base = np.array([baselines.get(n, math.nan) for n in names], dtype=float)
    g = exploding_growth(r, base, abs_ceiling=abs_ceiling, rel=rel, ratio=ratio, floor=floor)
    return {names[i]: float(g[i]) for i in np.flatnonzero(~np.isnan(g))}


@register_detector("gradient")
class GradientHealthDetector(Detector):
    """Vanishing/exploding gradients from per-layer parameter-gradient RMS.

    Baseline per layer: median RMS over the first ``warmup_checks`` checked steps with a
    backward pass, taken per unit of learning rate when the rate is known (``stats.lr``): a
    baseline formed under a warm-up's near-zero rate measures an untrained model that has not
    moved, so growth is judged against ``baseline x max(1, lr / baseline lr)``
    (:func:`lr_allowance`), and a check at rate 0 (nothing moves) joins no baseline.
    Steps without backward (evaluation) are ignored, and so is a layer without
    gradients in a step (missing, not vanished); an RMS of exactly zero is no observation
    either: a downstream factor that is zero by design (a LoRA A while its B is still 0)
    stops it exactly.

    Under a ``GradScaler`` (``stats.grad_scale`` set) a step with non-finite gradients is
    one the scaler skips: it is ignored unless overflows recur on ``config.scaler_overflow_patience``
    consecutive backward steps, which is then reported as ``exploding`` in every
    non-finite layer (``overflow_steps`` in the values).
    """

    reads_loss_only = False  # a loss-only step returns no hits here

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._index = LayerIndex()
        w = config.warmup_checks
        self._warm = np.zeros((0, w))              # warm-up RMS values per layer
        self._warm_lr = np.zeros((0, w))           # the learning rate of each of them (NaN: unknown)
        self._base_lr = np.zeros(0)                # median warm-up rate per layer (NaN: unknown)
        self._n_warm = np.zeros(0, dtype=np.intp)
        self._base = np.zeros(0)                   # NaN until the baseline is formed
        # layers that vanished while their baseline was forming: growth from there is
        # recovery, not explosion, so their baseline is not used for relative growth
        self._vanished_warm = np.zeros(0, dtype=bool)
        self._trusted = np.zeros(0)                # see _retrust
        self._overflow_run = 0
        # (positions, rate, the growth allowed, whether any baseline there still forms): a loop
        # repeats one name tuple at one rate, so most steps reuse them; _retrust and
        # forget_layer drop them (every change to a baseline or its rate goes through one)
        self._allowed: tuple | None = None

    def _fit(self) -> None:
        n = len(self._index)
        if n > len(self._base):
            self._warm = grown(self._warm, n, np.nan)
            self._warm_lr = grown(self._warm_lr, n, np.nan)
            self._base_lr = grown(self._base_lr, n, np.nan)
            self._n_warm = grown(self._n_warm, n, 0)
            self._base = grown(self._base, n, np.nan)
            self._vanished_warm = grown(self._vanished_warm, n, False)
            self._trusted = grown(self._trusted, n, np.nan)

    def _retrust(self, at) -> None:
        # the baselines relative growth is measured against: formed, not from a vanished
        # warm-up, above the vanishing floor (NaN elsewhere)
        b = self._base[at]
        self._trusted[at] = np.where(~self._vanished_warm[at] & (b > self.config.vanish_abs), b, np.nan)
        self._allowed = None

    def forget_layer(self, layer: str) -> None:
        """Drop a layer's baseline (the module behind the name was replaced)."""
        i = self._index.get(layer)
        if i is not None and i < len(self._base):
            self._n_warm[i] = 0
            self._base[i] = np.nan
            self._base_lr[i] = np.nan
            self._vanished_warm[i] = False
            self._trusted[i] = np.nan
            self._allowed = None

    def update(self, stats: StepStats) -> list[Event]:
        """Vanishing/exploding hits at this step."""
        if not stats.has_backward:
            return []
        if stats.grad_scale is not None:
            overflow = self._scaler_overflow(stats)
            if overflow is not None:
                return overflow
        n = stats.cols["pgrad_n"]
        obs = stats.has_pgrad & (n > 0)
        if not obs.any():
            return []
        with np.errstate(all="ignore"):
            # NaN where not observed; a NaN RMS of an observed layer is the data detector's
            r = np.sqrt(stats.cols["pgrad_sumsq"] / np.where(obs, n, np.nan))
            r[r == 0.0] = np.nan
            idx = self._index.of(stats.names)
            self._fit()
            lr = stats.lr
            got = self._allowed
            if got is None or got[0] is not idx or got[1] != lr:  # != also for two NaN rates: computed again
                got = self._allowed = (idx, lr, self._trusted[idx] * lr_allowance(lr, self._base_lr[idx]),
                                       bool(np.isnan(self._base[idx]).any()))
            trusted = got[2]
            events = [] if self._quiet(r, trusted) else self._events(stats, idx, r, trusted)
            if lr != 0.0 and got[3]:  # a check at rate 0 has not moved: no baseline of a moving model
                self._learn_baseline(idx, r, lr)
        return events

    def _quiet(self, r: np.ndarray, trusted: np.ndarray) -> bool:
        """A cheap screen: True when no layer can be exploding or vanishing (most steps)."""
        cfg = self.config
        top = np.fmax.reduce(r)
        if np.isnan(top):
            return True  # nothing finite observed
        if not top <= cfg.explode_abs or np.fmax.reduce(r / trusted) > cfg.explode_rel / 2:
            return False
        low = np.fmin.reduce(r)
        if low < cfg.vanish_abs:
            return False
        return not (low / top < cfg.vanish_ratio and np.count_nonzero(~np.isnan(r)) > 1)

    def _events(self, stats: StepStats, idx: np.ndarray, r: np.ndarray, trusted: np.ndarray) -> list[Event]:
        cfg = self.config
        base = self._base[idx]
        growth = exploding_growth(r, trusted, abs_ceiling=cfg.explode_abs, rel=cfg.explode_rel,
                                  ratio=cfg.explode_ratio, floor=cfg.vanish_abs)
        exploding = np.flatnonzero(~np.isnan(growth))
        events: list[Event] = []
        out_rms = stats.out_rms_column()
        if len(exploding):
            for i in exploding:
                g = float(growth[i])
                sev = 6.0 if math.isinf(g) else math.log10(max(g, 1.0))
                events.append(make_event(GRADIENT, "exploding", stats.names[i], stats.step, sev, {
                    "grad_rms": float(r[i]), "baseline_rms": float(base[i]), "growth": g,
                    "out_rms": float(out_rms[i])}))
            return events
        # one exploding layer makes every other layer look vanished next to it
        mask, rel = vanishing_mask(r, cfg.vanish_abs, cfg.vanish_ratio)
        hits = np.flatnonzero(mask)
        q = rel[hits].tolist()
        names = stats.names
        # out_rms separates tiny weights (tiny activations) from deep saturating stacks (normal
        # activations, gradients shrunk by the derivatives)
        events = make_events(GRADIENT, "vanishing", [names[i] for i in hits], stats.step,
                             [min(-math.log10(max(x, 1e-30)), 30.0) / 3.0 for x in q],
                             {"grad_rms": r[hits].tolist(), "ratio_to_max": q, "out_rms": out_rms[hits].tolist()})
        self._vanished_warm[idx[hits[np.isnan(base[hits])]]] = True
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
        out_rms = dict(zip(stats.names, stats.out_rms_column()))
        base = {n: float(self._base[i]) for n, i in self._index.pos.items() if i < len(self._base)}
        return [make_event(GRADIENT, "exploding", layer, stats.step, 6.0, {
            "grad_rms": math.inf, "baseline_rms": base.get(layer, math.nan), "growth": math.inf,
            "overflow_steps": float(self._overflow_run), "grad_scale": float(stats.grad_scale),
            "out_rms": float(out_rms.get(layer, math.nan))})
            for layer in sorted(bad, key=lambda n: order.get(n, len(order)))]

    def _learn_baseline(self, idx: np.ndarray, r: np.ndarray, lr: float | None) -> None:
        learn = np.isfinite(r) & np.isnan(self._base[idx])
        if not learn.any():
            return
        at = idx[learn]
        self._warm[at, self._n_warm[at]] = r[learn]
        self._warm_lr[at, self._n_warm[at]] = np.nan if lr is None else lr
        self._n_warm[at] += 1
        done = at[self._n_warm[at] >= self._warm.shape[1]]
        if len(done):
            self._base[done] = np.median(self._warm[done], axis=1)
            with np.errstate(invalid="ignore"):
                # NaN unless every warm-up check knew its rate
                self._base_lr[done] = np.median(self._warm_lr[done], axis=1)
            self._retrust(done)
