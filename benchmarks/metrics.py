"""Scoring functions of the failure-injection benchmark (pure: arrays and frames in, numbers out).

Label space
-----------
A run's label is ``"healthy"`` or one abnormal root state written ``"variable/state"``
(``"learning_rate/too_high"`` ...): the seven abnormal states of :mod:`neuraldbg.vocab`, plus
any state a developer adds later (picked up from the ``post_<variable>_<state>`` columns).

Prediction rule
---------------
The causal engine returns *marginals* (``P(learning_rate=too_high)``, ...) and ``P(healthy)``
= P(all causes ok). They are not one distribution over the labels (marginals of different
variables overlap), so the benchmark scores each label by

* ``healthy``: ``P(healthy)``;
* ``variable/state``: the posterior marginal ``P(variable = state)``;

and turns the scores into a distribution ``q`` by dividing by their sum. Top-1 is the argmax
of the scores (the same as of ``q``), top-k the k highest; ties go to the earlier label in
:data:`LABELS` order (``healthy`` first), which only matters for degenerate all-zero rows.
Brier, log loss and ECE use ``q``, so the Bayesian network and the baselines (which produce a
distribution over the same labels directly) are scored on one scale.

The distribution-level scores themselves (``normalize``, ``ranking``, ``top_label``,
``bin_index``, ``ece``, ``ece_null_band``, ``brier``, ``log_loss``, ``nll``) are
:mod:`neuraldbg.scoring`'s, imported here so the benchmark, the prior fitter and the
calibration experiment score alike; this module adds what reads records frames.

Calibration
-----------
Top-label ECE with 15 equal-width bins (Guo et al. 2017; bin ``m`` holds confidences in
``((m-1)/15, m/15]``, bin 1 also holds 0). Plug-in ECE is biased upward at small n: a
perfectly calibrated predictor shows ECE around 0.05-0.1 at n = 200. :func:`ece_null_band`
therefore draws labels from the predictor's own distribution (under that null, the top label
is right with probability equal to its confidence) many times and reports the central 95 %
of the resulting ECEs; an observed ECE at or below the band's upper end is consistent with
perfect calibration.
"""
from __future__ import annotations

import json
import math
import statistics
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from neuraldbg.scoring import (LOG_LOSS_EPS, N_BINS, bin_index, brier, check_probs, ece, ece_null_band, log_loss, nll,
                               normalize, ranking, top_label)
from neuraldbg.vocab import ABNORMAL_LABELS, HEALTHY, LABELS, ROOTS

__all__ = [
    "ABNORMAL_LABELS", "HEALTHY", "LABELS", "LOG_LOSS_EPS", "N_BINS", "ROOT_STATES", "accuracy", "bin_index",
    "bn_alarms", "brier", "check_probs", "confusion_matrix", "distribution_alarms", "distribution_from_json",
    "ece", "ece_null_band", "false_alarm_rate", "grouped_accuracy", "is_missing", "label_index", "label_of",
    "label_scores", "labels_from_columns", "localization", "log_loss", "nll", "normalize", "onset_errors",
    "parse_post_column", "post_column", "posterior_columns", "ranking", "reliability_null_band",
    "reliability_table", "score_distribution", "top_label", "topk_correct", "true_labels", "wilson_interval",
]

#: The root-cause variables and their states, under the name the benchmark always used.
ROOT_STATES = ROOTS


# --------------------------------------------------------------------------- labels

def label_of(cause: object, state: object) -> str:
    """The label of a ``(cause, state)`` pair; ``healthy`` when either is empty/NaN or ``ok``."""
    if is_missing(cause) or is_missing(state) or state == "ok":
        return HEALTHY
    return f"{cause}/{state}"


def post_column(variable: str, state: str) -> str:
    """Name of the records column holding ``P(variable = state)``."""
    return f"post_{variable}_{state}"


def posterior_columns(states: Mapping[str, Sequence[str]] = ROOT_STATES) -> list[str]:
    """Every ``post_<variable>_<state>`` column of ``states``, in order."""
    return [post_column(v, s) for v, ss in states.items() for s in ss]


def parse_post_column(column: str, variables: Iterable[str] = ROOT_STATES) -> tuple[str, str] | None:
    """Split ``post_<variable>_<state>`` into ``(variable, state)``; ``None`` for other columns.

    Known variables are matched as prefixes first because names contain underscores
    (``post_learning_rate_too_high``); an unknown variable is taken up to the first underscore.
    """
    if not column.startswith("post_"):
        return None
    rest = column[len("post_"):]
    for var in sorted(variables, key=len, reverse=True):
        if rest.startswith(var + "_") and len(rest) > len(var) + 1:
            return var, rest[len(var) + 1:]
    var, sep, state = rest.partition("_")
    return (var, state) if sep and state else None


def labels_from_columns(columns: Iterable[str]) -> tuple[str, ...]:
    """The label space implied by a records frame: :data:`LABELS` plus any extra abnormal state."""
    extra = []
    for col in columns:
        parsed = parse_post_column(col)
        if parsed is None or parsed[1] == "ok":
            continue
        lab = f"{parsed[0]}/{parsed[1]}"
        if lab not in LABELS and lab not in extra:
            extra.append(lab)
    return LABELS + tuple(extra)


def true_labels(records: pd.DataFrame) -> pd.Series:
    """The true label of each record (from ``true_cause``/``true_state``)."""
    return pd.Series(
        [label_of(c, s) for c, s in zip(records["true_cause"], records["true_state"])],
        index=records.index, name="true_label",
    )


def label_scores(records: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Raw score of every label per record: ``p_healthy`` and the abnormal posterior marginals.

    Missing values (an errored run) score 0, so such a row predicts ``healthy`` by tie-break;
    callers normally drop errored runs first.
    """
    labels = tuple(labels) if labels is not None else labels_from_columns(records.columns)
    out = {}
    for lab in labels:
        if lab == HEALTHY:
            col = "p_healthy"
        else:
            var, state = lab.split("/", 1)
            col = post_column(var, state)
        if col not in records.columns:
            raise ValueError(f"records lack column {col!r} needed for label {lab!r}")
        out[lab] = pd.to_numeric(records[col], errors="coerce").fillna(0.0).clip(lower=0.0)
    return pd.DataFrame(out, index=records.index)


def distribution_from_json(values: Iterable[object], labels: Sequence[str]) -> np.ndarray:
    """Rows of ``{label: p}`` JSON strings (or dicts) as an (n, L) array over ``labels``, normalized.

    Labels a row does not name get 0; an unparsable row becomes uniform.
    """
    rows = []
    for v in values:
        d = v if isinstance(v, Mapping) else _loads(v)
        rows.append([float(d.get(lab, 0.0)) for lab in labels] if d else [0.0] * len(labels))
    return normalize(np.array(rows, dtype=float).reshape(len(rows), len(labels)))


def label_index(y: Iterable[str], labels: Sequence[str]) -> np.ndarray:
    """Integer indices of labels ``y`` in ``labels``; a ``ValueError`` names unknown ones."""
    pos = {lab: i for i, lab in enumerate(labels)}
    y = list(y)
    unknown = sorted({lab for lab in y if lab not in pos})
    if unknown:
        raise ValueError(f"unknown labels {unknown}; valid: {', '.join(labels)}")
    return np.array([pos[lab] for lab in y], dtype=int)


# --------------------------------------------------------------------------- accuracy

def topk_correct(scores: np.ndarray, y: np.ndarray, k: int = 1) -> np.ndarray:
    """Boolean per row: the true label index ``y`` is among the ``k`` best-scored labels."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    y = np.asarray(y, dtype=int)
    if len(y) == 0:
        return np.zeros(0, dtype=bool)
    top = ranking(scores)[:, :k]
    return (top == y[:, None]).any(axis=1)


def accuracy(scores: np.ndarray, y: np.ndarray, k: int = 1) -> float:
    """Top-k accuracy; NaN for no rows."""
    hits = topk_correct(scores, y, k)
    return float(hits.mean()) if len(hits) else math.nan


def grouped_accuracy(scores: np.ndarray, y: np.ndarray, groups: Sequence[object],
                     ks: Sequence[int] = (1, 3)) -> pd.DataFrame:
    """Top-k accuracies and run counts per group (architecture, family ...), plus an ``overall`` row."""
    groups = np.asarray(list(groups), dtype=object)
    hits = {k: topk_correct(scores, y, k) for k in ks}
    rows = []
    for g in sorted(set(groups.tolist()), key=str):
        m = groups == g
        rows.append({"group": g, "n": int(m.sum()), **{f"top{k}": float(hits[k][m].mean()) for k in ks}})
    rows.append({"group": "overall", "n": int(len(groups)),
                 **{f"top{k}": (float(hits[k].mean()) if len(groups) else math.nan) for k in ks}})
    return pd.DataFrame(rows).set_index("group")


def confusion_matrix(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str]) -> pd.DataFrame:
    """Counts with true labels as rows and predicted labels as columns, every label present."""
    mat = pd.DataFrame(0, index=pd.Index(list(labels), name="true"),
                       columns=pd.Index(list(labels), name="predicted"))
    for t, p in zip(y_true, y_pred):
        if t not in mat.index or p not in mat.columns:
            raise ValueError(f"label {t if t not in mat.index else p!r} not in {list(labels)}")
        mat.loc[t, p] += 1
    return mat


# --------------------------------------------------------------------------- calibration

def reliability_table(confidence: np.ndarray, correct: np.ndarray, n_bins: int = N_BINS) -> pd.DataFrame:
    """Per bin: edges, count, mean confidence and accuracy (NaN for empty bins)."""
    c = np.asarray(confidence, dtype=float)
    ok = np.asarray(correct, dtype=float)
    b = bin_index(c, n_bins) if len(c) else np.zeros(0, dtype=int)
    cnt = np.bincount(b, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.bincount(b, weights=c, minlength=n_bins) / cnt
        acc = np.bincount(b, weights=ok, minlength=n_bins) / cnt
    return pd.DataFrame({
        "lo": np.arange(n_bins) / n_bins, "hi": np.arange(1, n_bins + 1) / n_bins,
        "count": cnt, "confidence": conf, "accuracy": acc,
    })


# --------------------------------------------------------------------------- false alarms

def bn_alarms(records: pd.DataFrame, threshold: float = 0.5) -> np.ndarray:
    """The network's alarm per record: a hypothesis reported (above the engine's floor) or P(healthy) < threshold."""
    reported = ~records["pred_cause"].map(is_missing).to_numpy(dtype=bool)
    ph = pd.to_numeric(records["p_healthy"], errors="coerce").fillna(0.0).to_numpy()
    return reported | (ph < threshold)


def distribution_alarms(probs: np.ndarray, healthy_index: int = 0, threshold: float = 0.5) -> np.ndarray:
    """A baseline's alarm per row: a failure label on top, or q(healthy) < threshold."""
    p = np.asarray(probs, dtype=float)
    pred, _ = top_label(p)
    return (pred != healthy_index) | (p[:, healthy_index] < threshold)


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Two-sided Wilson score interval ``(lo, hi)`` at ``level`` for ``k`` successes in ``n`` trials.

    Unlike the normal-approximation interval it stays inside [0, 1] and does not collapse to a
    point at ``k = 0``, which is where false-alarm rates live. ``(nan, nan)`` for ``n = 0``.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return math.nan, math.nan
    z = statistics.NormalDist().inv_cdf(1 - (1 - level) / 2)
    z2 = z * z
    centre = (k + z2 / 2) / (n + z2)
    half = z / (n + z2) * math.sqrt(k * (n - k) / n + z2 / 4)
    # at k = 0 (k = n) the bound is exactly 0 (1); rounding would leave 1e-17 there
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def false_alarm_rate(alarms: np.ndarray, level: float = 0.95) -> dict[str, float]:
    """Rate of alarms with its exact (Clopper-Pearson) one-sided upper bound at ``level``.

    The bound says how small a rate the run count can vouch for: zero alarms in 150 runs
    still only bound the rate by 0.02. ``wilson_lo``/``wilson_hi`` give the two-sided Wilson
    interval at the same level (:func:`wilson_interval`).
    """
    from scipy.stats import beta

    a = np.asarray(alarms, dtype=bool)
    n, k = int(a.size), int(a.sum())
    if n == 0:
        return {"n": 0, "alarms": 0, "rate": math.nan, "upper": math.nan, "wilson_lo": math.nan,
                "wilson_hi": math.nan}
    upper = 1.0 if k == n else float(beta.ppf(level, k + 1, n - k))
    lo, hi = wilson_interval(k, n, level)
    return {"n": n, "alarms": k, "rate": k / n, "upper": upper, "wilson_lo": lo, "wilson_hi": hi}


# --------------------------------------------------------------------------- localization

def localization(records: pd.DataFrame) -> dict[str, float]:
    """Origin-layer hit rate (runs whose injection names a layer) and onset error statistics.

    Onset error is detected minus injected step, over runs with both; ``onset_missing`` counts
    injected runs with a true onset but no detected one.
    """
    out: dict[str, float] = {}
    has_layer = ~records["true_layer"].map(is_missing).to_numpy(dtype=bool)
    sub = records[has_layer]
    hits = [(not is_missing(o)) and str(o) == str(t) for o, t in zip(sub["origin_layer"], sub["true_layer"])]
    out["layer_n"] = int(len(sub))
    out["layer_acc"] = float(np.mean(hits)) if len(sub) else math.nan
    det = pd.to_numeric(records["onset_step"], errors="coerce")
    true = pd.to_numeric(records["true_onset"], errors="coerce")
    both = det.notna() & true.notna()
    err = (det[both] - true[both]).to_numpy(dtype=float)
    out["onset_n"] = int(both.sum())
    out["onset_missing"] = int((true.notna() & det.isna()).sum())
    out["onset_mean_err"] = float(err.mean()) if len(err) else math.nan
    out["onset_median_abs_err"] = float(np.median(np.abs(err))) if len(err) else math.nan
    out["onset_within_5"] = float((np.abs(err) <= 5).mean()) if len(err) else math.nan
    return out


def onset_errors(records: pd.DataFrame) -> pd.Series:
    """Detected minus injected onset step per record (NaN where either is missing)."""
    det = pd.to_numeric(records["onset_step"], errors="coerce")
    true = pd.to_numeric(records["true_onset"], errors="coerce")
    return (det - true).rename("onset_error")


# --------------------------------------------------------------------------- summaries

def score_distribution(probs: np.ndarray, y: np.ndarray, scores: np.ndarray | None = None,
                       n_bins: int = N_BINS, null_draws: int = 2000, seed: int = 0) -> dict[str, float]:
    """Every label-level metric of one predictor: accuracy, ECE with null band, Brier, log loss.

    ``scores`` (default ``probs``) decide the ranking, ``probs`` the calibration metrics.
    """
    probs = check_probs(probs)
    scores = probs if scores is None else np.asarray(scores, dtype=float)
    y = np.asarray(y, dtype=int)
    pred, conf = top_label(probs)
    correct = pred == y
    band = ece_null_band(conf, n_bins=n_bins, draws=null_draws, seed=seed)
    e = ece(conf, correct, n_bins)
    return {
        "n": int(len(y)),
        "top1": accuracy(scores, y, 1),
        "top3": accuracy(scores, y, 3),
        "ece": e,
        "ece_null_lo": band["lo"],
        "ece_null_median": band["median"],
        "ece_null_hi": band["hi"],
        "ece_within_null": bool(e <= band["hi"]) if len(y) else False,
        "brier": brier(probs, y),
        "log_loss": log_loss(probs, y),
        "mean_confidence": float(conf.mean()) if len(conf) else math.nan,
    }


# --------------------------------------------------------------------------- helpers

def is_missing(v: object) -> bool:
    """True for None, NaN, pandas NA and blank strings: how records spell "no value"."""
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    try:
        if v is pd.NA or pd.isna(v):  # pandas NA / NaT
            return True
    except (TypeError, ValueError):
        pass
    return isinstance(v, str) and v.strip() == ""


def _loads(v: object) -> dict:
    if is_missing(v):
        return {}
    try:
        d = json.loads(str(v))
    except (TypeError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def reliability_null_band(confidence: np.ndarray, n_bins: int = N_BINS, draws: int = 2000,
                          level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Per bin, the ``level`` band of accuracy a perfectly calibrated predictor would show.

    Same null as :func:`ece_null_band` (each top label right with probability = confidence);
    empty bins get NaN. Drawn in the reliability diagram around the diagonal.
    """
    c = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
    n = len(c)
    lo = np.full(n_bins, np.nan)
    hi = np.full(n_bins, np.nan)
    if n:
        rng = np.random.default_rng(seed)
        b = bin_index(c, n_bins)
        cnt = np.bincount(b, minlength=n_bins)
        hits = rng.random((draws, n)) < c
        idx = (np.arange(draws)[:, None] * n_bins + b[None, :]).ravel()
        acc = np.bincount(idx, weights=hits.ravel().astype(float), minlength=draws * n_bins).reshape(draws, n_bins)
        a = (1 - level) / 2
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = acc / cnt
        filled = cnt > 0
        lo[filled] = np.quantile(acc[:, filled], a, axis=0)
        hi[filled] = np.quantile(acc[:, filled], 1 - a, axis=0)
    return pd.DataFrame({"null_lo": lo, "null_hi": hi})
