"""The report's headline: the zoo and the ecosystem suites side by side.

Four predictors, each scored on runs it was not fitted on:

* ``zoo_kfold`` -- zoo runs, CPDs fitted on the other folds of their family (K-fold by seed,
  :func:`benchmarks.priors_eval.kfold_by_seed`), temperature 1;
* ``zoo_loao`` -- zoo runs, CPDs fitted on every other architecture
  (:func:`benchmarks.priors_eval.loao_predictions`), temperature 1;
* ``eco_hand_set`` -- ecosystem sessions re-scored offline with the hand-set base priors of each
  run's family, never fitted on anything;
* ``eco_zoo_fitted`` -- the ecosystem sessions re-scored with the shipped (zoo-fitted) priors as
  they are now (identical to the recorded posteriors until the priors are refitted).

The temperature is chosen on the zoo alone: the grid value with the lowest pooled
leave-one-architecture-out held-out log loss. The ecosystem suite never takes part in that
choice; the report shows its scores before and after the zoo's temperature. Everything is
computed here from records and sessions; :mod:`benchmarks.report` renders it and
:func:`benchmarks.plots.plot_suite_reliability` draws it.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from benchmarks import metrics as M
from benchmarks import priors_eval as PE
from benchmarks.evaluation import PREDICTORS, fmt, usable
from benchmarks.records import LEGACY_SUITE, load_records
from neuraldbg.causal.cpd import build_cpds
from neuraldbg.causal.priors import load_priors
from neuraldbg.causal.structure import default_network
from neuraldbg.fit import DEFAULT_FOLDS, TEMPERATURE_GRID, Prediction, Run, hand_set_base, load_runs, predict

log = logging.getLogger("neuraldbg")

ZOO, ECOSYSTEM = "zoo", "ecosystem"
#: The headline's predictors (column keys) and their titles, in report order.
COLUMNS: dict[str, str] = {
    "zoo_kfold": f"zoo, {DEFAULT_FOLDS}-fold fitted priors",
    "zoo_loao": "zoo, leave-one-architecture-out",
    "eco_hand_set": "ecosystem, hand-set network",
    "eco_zoo_fitted": "ecosystem, zoo-fitted priors",
}
_COUNTS = ("n", "confident_n", "healthy_n", "false_alarms")
#: An answer counts as confident when its top label has at least this probability.
CONFIDENT = 0.9
BASELINES = [n for n, c in PREDICTORS.items() if c is not None]


# --------------------------------------------------------------------------- inputs

def _suite_of(rec: Mapping[str, Any]) -> str:
    s = rec.get("suite")
    return LEGACY_SUITE if M.is_missing(s) else str(s)


def _key_of(rec: Mapping[str, Any]) -> str:
    # load_runs' own fallback, so records and runs meet on the same key
    k = rec.get("key")
    return str(k) if not M.is_missing(k) else f"{rec['arch']}__{rec['injection']}__{rec['seed']}"


def gather(dirs: Sequence[str | Path]) -> dict[str, Any]:
    """Records and runs of every suite in ``dirs``, with what was skipped and why.

    Returns ``{"runs": {suite: [Run]}, "rows": {suite: records frame aligned with runs},
    "counts": {suite: {"records", "errored", "no_session", "scored"}}}``. A run is scored when it
    finished with a posterior, its session file loads, and it has one injected truth.
    """
    runs: dict[str, list[Run]] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, dict[str, int]] = {}
    seen: set[str] = set()
    for d in dirs:
        df = load_records(d)
        loaded = {r.key: r for r in load_runs(d)} if len(df) else {}
        ok_keys = {_key_of(r) for r in usable(df).to_dict("records")} if len(df) else set()
        for rec in df.to_dict("records"):
            suite, key = _suite_of(rec), _key_of(rec)
            c = counts.setdefault(suite, {"records": 0, "errored": 0, "no_session": 0, "scored": 0})
            if key in seen:  # the same run in two folders: count it once
                log.warning("side_by_side: run %s appears in more than one folder; the first is used", key)
                continue
            seen.add(key)
            c["records"] += 1
            run = loaded.get(key)
            if key not in ok_keys:
                c["errored"] += 1
            elif run is None or run.label is None:
                c["no_session"] += 1
            else:
                c["scored"] += 1
                runs.setdefault(suite, []).append(run)
                rows.setdefault(suite, []).append(rec)
    return {"runs": runs, "rows": {s: pd.DataFrame(r) for s, r in rows.items()}, "counts": counts}


# --------------------------------------------------------------------------- scoring

def score_row(probs: np.ndarray, y: np.ndarray, alarms: np.ndarray, healthy: np.ndarray,
              baselines: Mapping[str, np.ndarray] | None = None, null_draws: int = 2000,
              seed: int = 0) -> dict[str, Any]:
    """One headline column: accuracy, calibration, false alarms, confident answers, baselines.

    ``probs`` (n, L) label distributions, ``y`` true label indices, ``alarms`` the predictor's
    alarm per run, ``healthy`` which runs are healthy, ``baselines`` {name: (n, L)} on the same runs.
    """
    y = np.asarray(y, dtype=int)
    n = len(y)
    row: dict[str, Any] = {"n": n}
    if n:
        row.update(M.score_distribution(probs, y, null_draws=null_draws, seed=seed))
        pred, conf = M.top_label(probs)
        sure = conf >= CONFIDENT
        row["confident_n"] = int(sure.sum())
        row["confident_acc"] = float((pred == y)[sure].mean()) if sure.any() else math.nan
    else:
        row.update({k: math.nan for k in ("top1", "top3", "ece", "ece_null_lo", "ece_null_hi", "ece_within_null",
                                          "brier", "log_loss", "mean_confidence", "confident_acc")})
        row["confident_n"] = 0
    h = np.asarray(healthy, dtype=bool)
    k, nh = int(np.asarray(alarms, dtype=bool)[h].sum()), int(h.sum())
    lo, hi = M.wilson_interval(k, nh)
    row.update(healthy_n=nh, false_alarms=k, false_alarm=(k / nh if nh else math.nan),
               false_alarm_lo=lo, false_alarm_hi=hi)
    for name in BASELINES:
        b = (baselines or {}).get(name)
        row[f"{name}_top1"] = M.accuracy(b, y) if b is not None and n else math.nan
    return row


def _labels(runs: Sequence[Run]) -> tuple[np.ndarray, np.ndarray]:
    y = M.label_index([r.label for r in runs], M.LABELS)
    return y, y == M.LABELS.index(M.HEALTHY)


def _baselines(rows: pd.DataFrame | None) -> dict[str, np.ndarray]:
    out = {}
    for name in BASELINES:
        col = PREDICTORS[name]
        if rows is not None and len(rows) and col in rows.columns and not rows[col].map(M.is_missing).all():
            out[name] = M.distribution_from_json(rows[col], M.LABELS)
    return out


def _pred_row(pred: Prediction, runs: Sequence[Run], rows: pd.DataFrame | None, **kw: Any) -> dict[str, Any]:
    y, h = _labels(runs)
    return score_row(pred.label_probs, y, PE.alarms(pred) if len(runs) else np.zeros(0, bool), h,
                     _baselines(rows), **kw)


def _rows_for(runs: Sequence[Run], all_runs: Sequence[Run], rows: pd.DataFrame | None) -> pd.DataFrame | None:
    """The records rows of ``runs`` (a reordered subset of ``all_runs``)."""
    if rows is None:
        return None
    pos = {r.key: i for i, r in enumerate(all_runs)}
    return rows.iloc[[pos[r.key] for r in runs]].reset_index(drop=True)


def choose_temperature(loao: Mapping[str, Any], grid: Sequence[float] = TEMPERATURE_GRID
                       ) -> tuple[float | None, dict[float, float]]:
    """The temperature with the lowest pooled LOAO held-out log loss (ties: closest to 1).

    ``loao`` is :func:`benchmarks.priors_eval.loao_predictions` of **zoo** runs only, computed
    at every temperature of ``grid``; ``(None, {})`` when it holds no runs.
    """
    runs = loao["runs"]
    if not runs:
        return None, {}
    y, _ = _labels(runs)
    losses = {float(t): M.log_loss(loao["loao"][float(t)].label_probs, y) for t in grid}
    best = min(losses, key=lambda t: (losses[t], abs(math.log(t))))
    return best, losses


def rescore(runs: Sequence[Run], temperature: float | None, fitted: bool) -> Prediction:
    """Posteriors of ``runs`` under each run's family priors: the hand-set base, or the shipped
    (``fitted``) file; at ``temperature`` (``None``: the file's own). Rows in ``runs`` order."""
    preds: list[Prediction] = []
    order: list[int] = []
    for fam in sorted({r.family for r in runs}):
        idx = [i for i, r in enumerate(runs) if r.family == fam]
        pri = load_priors(fam)
        pri = pri if fitted else hand_set_base(pri)
        t = pri.temperature if temperature is None else temperature
        preds.append(predict(build_cpds(pri.roots, pri.cpds, default_network()), [runs[i] for i in idx], t))
        order += idx
    p = PE.concat_predictions(preds)
    inv = np.argsort(np.array(order, dtype=int))
    return Prediction({v: m[inv] for v, m in p.marginals.items()}, p.p_healthy[inv], p.label_probs[inv])


def _empty() -> Prediction:
    return PE.concat_predictions([])


# --------------------------------------------------------------------------- the whole comparison

def compare(dirs: Sequence[str | Path], null_draws: int = 2000, seed: int = 0,
            grid: Sequence[float] = TEMPERATURE_GRID, priors_res: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every number of the side-by-side section (see the module doc).

    ``priors_res`` is :func:`benchmarks.priors_eval.evaluate` of the zoo runs, computed here
    when not given. Returns ``{"table", "calibration", "temperature", "temperature_loss",
    "counts", "reliability", "priors"}``; a missing suite gives ``n = 0`` columns.
    """
    g = gather(dirs)
    zoo, eco = g["runs"].get(ZOO, []), g["runs"].get(ECOSYSTEM, [])
    zrows, erows = g["rows"].get(ZOO), g["rows"].get(ECOSYSTEM)
    kw = {"null_draws": null_draws, "seed": seed}
    if zoo and priors_res is None:
        priors_res = PE.evaluate("zoo runs", runs=zoo, temperatures=grid)
    table: dict[str, dict[str, Any]] = {}
    preds: dict[str, tuple[Prediction, list[Run]]] = {}
    if zoo:
        cvs = priors_res["cvs"]
        kruns = [r for cv in cvs.values() for r in cv.runs]
        preds["zoo_kfold"] = (PE.concat_predictions([cv.fitted for cv in cvs.values()]), kruns)
        lp = priors_res["loao_preds"]
        preds["zoo_loao"] = (lp["loao"][1.0], list(lp["runs"]))
        temp, losses = choose_temperature(lp, grid)
    else:
        preds["zoo_kfold"] = preds["zoo_loao"] = (_empty(), [])
        temp, losses = None, {}
    for name in ("zoo_kfold", "zoo_loao"):
        p, r = preds[name]
        table[name] = _pred_row(p, r, _rows_for(r, zoo, zrows), **kw)
    preds["eco_hand_set"] = (rescore(eco, None, fitted=False) if eco else _empty(), eco)
    table["eco_hand_set"] = _pred_row(*preds["eco_hand_set"], erows, **kw)
    # the shipped (zoo-fitted) priors as they are now, re-scored from the sessions: the same as
    # the recorded posteriors until the priors are refitted, and still right after a refit
    preds["eco_zoo_fitted"] = (rescore(eco, None, fitted=True) if eco else _empty(), eco)
    table["eco_zoo_fitted"] = _pred_row(*preds["eco_zoo_fitted"], erows, **kw)

    # calibration on the new suite, before and after the zoo's temperature
    calib: dict[str, dict[str, Any]] = {}
    tempered: dict[str, tuple[Prediction, list[Run]]] = {}
    if zoo:
        calib[f"zoo LOAO, T = {fmt(temp, 2)} (chosen on these runs)"] = _pred_row(
            lp["loao"][temp], lp["runs"], None, **kw)
    for fitted, title in ((False, "ecosystem, hand-set network"), (True, "ecosystem, zoo-fitted priors (re-scored)")):
        before = rescore(eco, None, fitted) if eco else _empty()
        calib[f"{title}, T = file's"] = _pred_row(before, eco, None, **kw)
        after = rescore(eco, temp, fitted) if eco and temp is not None else _empty()
        calib[f"{title}, T = {fmt(temp, 2)} (zoo LOAO)"] = _pred_row(after, eco if len(after.p_healthy) else [],
                                                                     None, **kw)
        if not fitted:
            tempered["eco_hand_set_tempered"] = (after, eco if len(after.p_healthy) else [])

    rel = {ZOO: {COLUMNS[k]: _reliability(*preds[k]) for k in ("zoo_kfold", "zoo_loao")},
           ECOSYSTEM: {COLUMNS["eco_hand_set"]: _reliability(*preds["eco_hand_set"]),
                       f"hand-set, T = {fmt(temp, 2)} (zoo LOAO)": _reliability(*tempered["eco_hand_set_tempered"]),
                       COLUMNS["eco_zoo_fitted"]: _reliability(*preds["eco_zoo_fitted"])}}
    return {"table": pd.DataFrame(table), "calibration": pd.DataFrame(calib).T, "temperature": temp,
            "temperature_loss": losses, "counts": g["counts"], "reliability": rel, "priors": priors_res,
            "null_draws": null_draws}


def _reliability(pred: Prediction, runs: Sequence[Run]) -> pd.DataFrame:
    return _reliability_probs(pred.label_probs, runs)


def _reliability_probs(probs: np.ndarray, runs: Sequence[Run], draws: int = 500) -> pd.DataFrame:
    y = _labels(runs)[0] if runs else np.zeros(0, int)
    pred, conf = M.top_label(probs) if len(y) else (np.zeros(0, int), np.zeros(0))
    return pd.concat([M.reliability_table(conf, pred == y), M.reliability_null_band(conf, draws=draws)], axis=1)


# --------------------------------------------------------------------------- markdown and files

#: Headline rows: (title, cell of a column's scores).
_ROWS: tuple[tuple[str, Any], ...] = (
    ("runs scored (n)", lambda r: str(int(r["n"]))),
    ("top-1", lambda r: fmt(r["top1"])),
    ("top-3", lambda r: fmt(r["top3"])),
    ("log loss", lambda r: fmt(r["log_loss"])),
    ("Brier", lambda r: fmt(r["brier"])),
    ("ECE", lambda r: fmt(r["ece"])),
    ("ECE null band (95%)", lambda r: _band(r)),
    ("ECE inside the band", lambda r: "n/a" if not r["n"] else fmt(bool(r["ece_within_null"]))),
    ("healthy false alarms", lambda r: f"{int(r['false_alarms'])}/{int(r['healthy_n'])}"),
    ("false-alarm rate, Wilson 95%", lambda r: "n/a" if not r["healthy_n"] else
     f"{fmt(r['false_alarm'])} [{fmt(r['false_alarm_lo'])}, {fmt(r['false_alarm_hi'])}]"),
    (f"accuracy when top p >= {CONFIDENT} (answers)", lambda r: f"{fmt(r['confident_acc'])} ({int(r['confident_n'])})"),
    *((f"baseline {b}: top-1", lambda r, b=b: fmt(r[f"{b}_top1"])) for b in BASELINES),
)


def _band(r: Mapping[str, Any]) -> str:
    return f"[{fmt(r['ece_null_lo'])}, {fmt(r['ece_null_hi'])}]" if r["n"] else "n/a"


def _md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render(res: Mapping[str, Any]) -> str:
    """The side-by-side section of REPORT.md (level-2 headings)."""
    t, temp = res["table"], res["temperature"]
    head = ["", *(COLUMNS[c] for c in t.columns)]
    body = [[title, *(cell(t[c]) for c in t.columns)] for title, cell in _ROWS]
    counts = res["counts"]
    skipped = "; ".join(f"{s}: {c['scored']} of {c['records']} runs scored ({c['errored']} errored, "
                        f"{c['no_session']} without a usable session)" for s, c in sorted(counts.items())) or "no runs"
    cal = res["calibration"]
    cal_rows = [[name, str(int(r["n"])), fmt(r["top1"]), fmt(r["log_loss"]), fmt(r["brier"]), fmt(r["ece"]), _band(r),
                 "n/a" if not r["n"] else fmt(bool(r["ece_within_null"]))] for name, r in cal.iterrows()]
    curve = ", ".join(f"{k:g}: {v:.3f}" for k, v in sorted(res["temperature_loss"].items()))
    return "\n".join([
        "## Suites side by side\n",
        "Every column is scored on runs its network was not fitted on. *zoo, K-fold*: CPDs fitted on the "
        "other folds of the run's family (by seed; by run when there are fewer seeds than folds); *zoo, "
        "leave-one-architecture-out*: CPDs fitted on every other architecture; *ecosystem, hand-set*: the "
        "ecosystem sessions re-scored with the hand-set priors of their family; *ecosystem, zoo-fitted*: the "
        "ecosystem sessions re-scored with the shipped priors (fitted on the zoo only). All at temperature 1. "
        f"False alarms: healthy runs that raise one; confident answers: top label probability >= {CONFIDENT}. "
        "The baselines are scored on the same runs as the column.\n",
        f"Runs: {skipped}.\n",
        _md(head, body),
        "### Calibration on a new suite: the zoo's temperature\n",
        (f"Temperature chosen on the zoo only: T = {fmt(temp, 2)}, the lowest pooled leave-one-architecture-out "
         f"held-out log loss over the grid ({curve}). The ecosystem runs play no part in the choice; below, "
         "their scores with the file's temperature and with the zoo's (the evidence log-likelihood divided by T)."
         if temp is not None else "No zoo runs: no temperature chosen, the rows after it are n/a."),
        "",
        _md(["predictor", "n", "top-1", "log loss", "Brier", "ECE", "ECE null band", "inside"], cal_rows),
    ])


def write_tables(res: Mapping[str, Any], out: str | Path) -> list[Path]:
    """``suites.csv`` (one row per headline column) and ``suites.json`` (that, the calibration
    table, the temperature and the run counts) in ``out``; returns the paths."""
    import json

    out = Path(out)
    t = res["table"].T
    for c in _COUNTS:  # whole numbers, even in a column of n/a scores
        t[c] = t[c].astype(int)
    t.insert(0, "predictor", [COLUMNS[c] for c in t.index])
    t.index.name = "key"
    t.to_csv(out / "suites.csv")
    doc = {"columns": COLUMNS, "table": json.loads(t.to_json(orient="index")),
           "calibration": json.loads(res["calibration"].to_json(orient="index")),
           "temperature": res["temperature"], "temperature_rule": "argmin pooled zoo LOAO held-out log loss",
           "temperature_loss": {f"{k:g}": v for k, v in res["temperature_loss"].items()}, "counts": res["counts"]}
    (out / "suites.json").write_text(json.dumps(doc, indent=1))
    return [out / "suites.csv", out / "suites.json"]
