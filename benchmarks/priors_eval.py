"""Does prior tuning help, on runs it was not fitted on? (held-out verification)

Two checks on a benchmark output directory (``records.csv`` + ``sessions/``):

* :func:`kfold_by_seed` -- per family, K folds grouped by seed (all runs of a seed held out
  together; by run when the directory has fewer seeds than folds, e.g. ``--quick``): the
  shipped hand-set priors versus CPDs fitted on the other folds (temperature 1, and the
  temperature chosen on held-out log loss), scored on the held-out runs;
* :func:`leave_one_arch_out` -- per architecture, CPDs fitted on every *other*
  architecture's runs (all families pooled; the held-out architecture's family file gives
  the root priors and the prior shape) and scored on the held-out one, next to the hand-set
  score and the in-family K-fold score of the same runs; the **gap** (LOAO minus in-family
  log loss) is how much a user loses by tuning on someone else's models.

Scores are the benchmark's own (``benchmarks/metrics.py``): log loss, Brier, top-label ECE
(15 bins) and top-1 over the label space ``healthy`` + the seven abnormal root states. Top-1
must not drop: calibration bought with accuracy is flagged.

``python -m benchmarks.priors_eval DIR [--folds K] [--ess N]`` writes ``DIR/PRIORS.md``;
:func:`evaluate` and :func:`render` are what the benchmark report can call.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import logging
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from benchmarks import log_to_stderr, metrics as M
from neuraldbg.causal.cpd import build_cpds
from neuraldbg.causal.priors import load_priors
from neuraldbg.causal.structure import default_network
from neuraldbg.fit import (DEFAULT_ESS, DEFAULT_FOLDS, Prediction, Run, cross_validate, fit_cpds, hand_set_base,
                           load_runs, predict)

log = logging.getLogger("neuraldbg")

PREDICTORS = ("hand_set", "fitted", "fitted_tempered")
#: a healthy run raises an alarm when P(healthy) falls under this (``metrics.bn_alarms``)
ALARM_THRESHOLD = 0.5


def scores(probs: np.ndarray, runs: Sequence[Run], weights: np.ndarray | None = None) -> dict[str, float]:
    """Benchmark scores of label distributions over runs with a single injected truth; with
    ``weights`` (prior-mix importance weights) also ``mix_log_loss``."""
    keep = [i for i, r in enumerate(runs) if r.label is not None]
    if not keep:
        return {"n": 0, "log_loss": math.nan, "brier": math.nan, "ece": math.nan, "top1": math.nan,
                "mix_log_loss": math.nan}
    p = probs[keep]
    y = M.label_index([runs[i].label for i in keep], M.LABELS)
    pred, conf = M.top_label(p)
    out = {"n": len(keep), "log_loss": M.log_loss(p, y), "brier": M.brier(p, y),
           "ece": M.ece(conf, pred == y), "top1": M.accuracy(p, y)}
    if weights is not None:
        out["mix_log_loss"] = float(np.average(M.nll(p, y), weights=np.asarray(weights)[keep]))
    return out


def alarms(pred: Prediction, threshold: float = ALARM_THRESHOLD) -> np.ndarray:
    """The benchmark's alarm rule (``metrics.bn_alarms``) on a prediction: a hypothesis would
    be reported (an abnormal marginal at or above the engine's floor) or P(healthy) < threshold."""
    from neuraldbg.causal.hypotheses import REPORT_FLOOR

    top = np.max([pred.marginals[v][:, 1:].max(axis=1) for v in pred.marginals], axis=0)
    return (top >= REPORT_FLOOR) | (pred.p_healthy < threshold)


def false_alarm_rate(alarm: np.ndarray, runs: Sequence[Run]) -> float:
    """Share of healthy runs that raise an alarm."""
    h = np.array([r.label == M.HEALTHY for r in runs], dtype=bool)
    return float(np.asarray(alarm)[h].mean()) if h.any() else math.nan


def _row(prefix: str, s: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}_{k}": v for k, v in s.items() if k != "n"}


def kfold_by_seed(runs: Sequence[Run], families: Sequence[str] | None = None, folds: int = DEFAULT_FOLDS,
                  ess: float = DEFAULT_ESS, seed: int = 0) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per family (plus a pooled ``all`` row): held-out scores of hand-set vs fitted priors.

    Returns the table and ``{family: CVResult}`` (per-run held-out predictions, for the
    leave-one-architecture-out gap). Families with fewer runs than ``folds`` are skipped.
    """
    fams = sorted({r.family for r in runs}) if families is None else list(families)
    rows, cvs = [], {}
    pooled: dict[str, list[np.ndarray]] = {p: [] for p in PREDICTORS}
    pooled_runs: list[Run] = []
    pooled_w: list[np.ndarray] = []
    pooled_ok: dict[str, list[np.ndarray]] = {p: [] for p in PREDICTORS}
    for fam in fams:
        fr = [r for r in runs if r.family == fam]
        if len(fr) < folds:
            log.warning("priors_eval: %s has %d runs, fewer than %d folds; skipped", fam, len(fr), folds)
            continue
        # against the hand-set tables even once the shipped file is a fitted one (which may
        # have been fitted on these very runs)
        cv = cross_validate(fr, hand_set_base(load_priors(fam)), ess=ess, folds=folds, seed=seed)
        cvs[fam] = cv
        row: dict[str, Any] = {"family": fam, "runs": len(fr), "grouping": cv.grouping,
                               "temperature": cv.temperature}
        for name, pred in zip(PREDICTORS, (cv.base, cv.fitted, cv.fitted_t)):
            s = scores(pred.label_probs, fr, cv.weights)
            s["false_alarm"] = false_alarm_rate(alarms(pred), fr)
            row["n"] = s["n"]
            row.update(_row(name, s))
            pooled_ok[name].append(alarms(pred))
            pooled[name].append(pred.label_probs)
        pooled_runs.extend(fr)
        pooled_w.append(cv.weights)
        rows.append(row)
    if rows:
        row = {"family": "all", "runs": len(pooled_runs), "grouping": "/".join(sorted({r["grouping"] for r in rows})),
               "temperature": math.nan}
        for name in PREDICTORS:
            s = scores(np.concatenate(pooled[name]), pooled_runs, np.concatenate(pooled_w))
            s["false_alarm"] = false_alarm_rate(np.concatenate(pooled_ok[name]), pooled_runs)
            row["n"] = s["n"]
            row.update(_row(name, s))
        rows.append(row)
    df = pd.DataFrame(rows).set_index("family") if rows else pd.DataFrame()
    if len(df):
        for name in ("fitted", "fitted_tempered"):
            df[f"{name}_dlog_loss"] = df[f"{name}_log_loss"] - df["hand_set_log_loss"]
            df[f"{name}_dtop1"] = df[f"{name}_top1"] - df["hand_set_top1"]
    return df, cvs


def loao_predictions(runs: Sequence[Run], ess: float = DEFAULT_ESS, temperatures: Sequence[float] = (1.0,),
                     archs: Sequence[str] | None = None) -> dict[str, Any]:
    """Held-out predictions of every run whose architecture is left out of the fit.

    Per architecture, CPDs are fitted on every *other* architecture's runs (all families
    pooled; the held-out family's hand-set file gives the root priors and the prior shape).
    Returns ``{"runs": [...], "hand_set": Prediction, "loao": {T: Prediction}, "train_runs": {arch: n}}``
    with rows in ``runs`` order; architectures without other runs to train on are left out.
    """
    archs = sorted({r.arch for r in runs}) if archs is None else list(archs)
    grid = sorted({float(t) for t in temperatures})
    order: list[Run] = []
    hand: list[Prediction] = []
    per_t: dict[float, list[Prediction]] = {t: [] for t in grid}
    trained: dict[str, int] = {}
    for arch in archs:
        test = [r for r in runs if r.arch == arch]
        train = [r for r in runs if r.arch != arch]
        if not test or not train:
            continue
        pri = hand_set_base(load_priors(test[0].family))
        base = build_cpds(pri.roots, pri.cpds, default_network())
        fitted, _ = fit_cpds(train, base, ess=ess, engine="numpy")
        order += test
        hand.append(predict(base, test, pri.temperature))
        for t in grid:
            per_t[t].append(predict(fitted, test, t))
        trained[arch] = len(train)
    return {"runs": order, "hand_set": concat_predictions(hand),
            "loao": {t: concat_predictions(p) for t, p in per_t.items()},
            "train_runs": trained}


def concat_predictions(preds: Sequence[Prediction]) -> Prediction:
    """Predictions of several run sets stacked in order (an empty one for none)."""
    if not preds:
        return Prediction({}, np.zeros(0), np.zeros((0, len(M.LABELS))))
    marg = {v: np.concatenate([p.marginals[v] for p in preds]) for v in preds[0].marginals}
    return Prediction(marg, np.concatenate([p.p_healthy for p in preds]),
                      np.concatenate([p.label_probs for p in preds]))


def leave_one_arch_out(runs: Sequence[Run], ess: float = DEFAULT_ESS, cvs: Mapping[str, Any] | None = None,
                       archs: Sequence[str] | None = None, preds: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Per architecture: hand-set vs CPDs fitted on all other architectures, on its runs.

    With ``cvs`` (from :func:`kfold_by_seed`) the in-family held-out score of the same runs
    is added and ``gap_log_loss`` = LOAO fitted - in-family fitted (both at temperature 1).
    ``preds`` (from :func:`loao_predictions`, with temperature 1) saves refitting.
    """
    preds = preds if preds is not None else loao_predictions(runs, ess=ess, archs=archs)
    prun = preds["runs"]
    rows = []
    for arch in dict.fromkeys(r.arch for r in prun):
        idx = [i for i, r in enumerate(prun) if r.arch == arch]
        test = [prun[i] for i in idx]
        fam = test[0].family
        row: dict[str, Any] = {"arch": arch, "family": fam, "runs": len(test), "train_runs": preds["train_runs"][arch]}
        row.update(_row("hand_set", scores(preds["hand_set"].label_probs[idx], test)))
        row.update(_row("loao", scores(preds["loao"][1.0].label_probs[idx], test)))
        cv = (cvs or {}).get(fam)
        if cv is not None:
            cidx = [i for i, r in enumerate(cv.runs) if r.arch == arch]
            row.update(_row("in_family", scores(cv.fitted.label_probs[cidx], [cv.runs[i] for i in cidx])))
            row["gap_log_loss"] = row["loao_log_loss"] - row["in_family_log_loss"]
            row["gap_top1"] = row["loao_top1"] - row["in_family_top1"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("arch") if rows else pd.DataFrame()


def evaluate(dir_: str | Path, folds: int = DEFAULT_FOLDS, ess: float = DEFAULT_ESS, seed: int = 0,
             runs: Sequence[Run] | None = None, temperatures: Sequence[float] = (1.0,)) -> dict[str, Any]:
    """Both checks on a benchmark output directory: ``{"kfold", "loao", "runs", ...}``.

    Also returns the per-run held-out predictions: ``"cvs"`` (K-fold, per family) and
    ``"loao_preds"`` (:func:`loao_predictions` at ``temperatures``, 1.0 always included).
    """
    runs = list(runs) if runs is not None else load_runs(dir_)
    if not runs:
        raise ValueError(f"{dir_}: no usable runs (records.csv with session files)")
    kf, cvs = kfold_by_seed(runs, folds=folds, ess=ess, seed=seed)
    preds = loao_predictions(runs, ess=ess, temperatures=sorted({1.0, *map(float, temperatures)}))
    loao = leave_one_arch_out(runs, ess=ess, cvs=cvs, preds=preds)
    return {"kfold": kf, "loao": loao, "runs": len(runs), "folds": folds, "ess": ess,
            "seeds": sorted({r.seed for r in runs}), "archs": sorted({r.arch for r in runs}),
            "cvs": cvs, "loao_preds": preds}


def _fmt(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        return "—" if not math.isfinite(v) else f"{v:.3f}"
    return str(v)


def _table(df: pd.DataFrame, cols: Sequence[str], headers: Sequence[str]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for idx, r in df.iterrows():
        lines.append("| " + " | ".join([str(idx)] + [_fmt(r.get(c, math.nan)) for c in cols]) + " |")
    return "\n".join(lines)


def render(res: Mapping[str, Any], dir_: str | Path = "") -> str:
    """The markdown of ``PRIORS.md``."""
    kf, loao = res["kfold"], res["loao"]
    out = [f"# Prior tuning: held-out verification ({dir_})", "",
           f"{res['runs']} runs, seeds {res['seeds']}, {len(res['archs'])} architectures; "
           f"ESS {res['ess']:g} per parent configuration, {res['folds']} folds. Generated "
           f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC by `python -m benchmarks.priors_eval`.",
           "Scores as in REPORT.md (label space healthy + 7 abnormal states; log loss clipped at 1e-6, "
           "top-label ECE with 15 bins). *fitted*: CPDs fitted on the other folds, temperature 1; "
           "*tempered*: the temperature chosen on the pooled held-out log loss (chosen on the same "
           "folds it is scored on, so slightly optimistic). *mix log loss*: the held-out log loss with runs "
           "reweighted to the label mix the family's root priors imply (mostly healthy runs), the "
           "criterion the temperature is chosen on. *false alarms*: held-out healthy runs that would "
           "raise an alarm (a hypothesis at or above the 0.2 reporting floor, or P(healthy) < 0.5; "
           "the rule of REPORT.md).", ""]
    if len(kf):
        out += ["## K-fold by seed, per family", "",
                "Grouping `seed` holds out every run of a seed together; `run` is used when the "
                "directory has fewer seeds than folds (a `--quick` run), and then the same "
                "architecture x injection can sit on both sides of a split.", ""]
        cols, heads = ["runs", "grouping", "temperature"], ["family", "runs", "folds by", "T"]
        for m, h in (("log_loss", "log loss"), ("brier", "Brier"), ("ece", "ECE"), ("top1", "top-1"),
                     ("mix_log_loss", "mix log loss"), ("false_alarm", "false alarms")):
            cols += [f"hand_set_{m}", f"fitted_{m}", f"fitted_tempered_{m}"]
            heads += [f"{h} hand", f"{h} fit", f"{h} temp"]
        out += [_table(kf, cols, heads), ""]
        drops = kf[(kf["fitted_dtop1"] < -1e-9) | (kf["fitted_tempered_dtop1"] < -1e-9)]
        if len(drops):
            out += ["**Top-1 dropped** with fitted priors for: "
                    + ", ".join(f"{f} ({r['fitted_dtop1']:+.3f} / {r['fitted_tempered_dtop1']:+.3f})"
                                for f, r in drops.iterrows()) + ". Calibration must not be bought with accuracy: "
                    "do not ship fitted priors for these families from this run.", ""]
        else:
            out += ["Top-1 on held-out folds does not drop for any family.", ""]
    if len(loao):
        out += ["## Leave one architecture out", "",
                "CPDs fitted on every other architecture's runs (all families), scored on the held-out "
                "architecture (its family's root priors); *in-family*: the K-fold score of the same runs "
                "with priors fitted on its own family's other folds. Gap = LOAO − in-family log loss.", ""]
        cols = ["family", "runs", "hand_set_log_loss", "loao_log_loss", "in_family_log_loss", "gap_log_loss",
                "hand_set_top1", "loao_top1", "in_family_top1", "hand_set_ece", "loao_ece"]
        heads = ["arch", "family", "runs", "log loss hand", "LOAO", "in-family", "gap", "top-1 hand", "LOAO",
                 "in-family", "ECE hand", "ECE LOAO"]
        out += [_table(loao, cols, heads), ""]
        if "gap_log_loss" in loao:
            g = loao["gap_log_loss"].dropna()
            if len(g):
                out += [f"Median gap {g.median():+.3f} nats (max {g.max():+.3f}, {g.idxmax()}).", ""]
    return "\n".join(out)


def write_report(dir_: str | Path, folds: int = DEFAULT_FOLDS, ess: float = DEFAULT_ESS, seed: int = 0) -> Path:
    """Evaluate and write ``DIR/PRIORS.md``; returns its path."""
    d = Path(dir_)
    res = evaluate(d, folds=folds, ess=ess, seed=seed)
    path = d / "PRIORS.md"
    path.write_text(render(res, d) + "\n", encoding="utf-8")
    res["kfold"].to_csv(d / "priors_kfold.csv")
    res["loao"].to_csv(d / "priors_loao.csv")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.priors_eval DIR [--folds K] [--ess N] [--seed S]``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.priors_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="benchmark output directory (records.csv + sessions/)")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS)
    p.add_argument("--ess", type=float, default=DEFAULT_ESS)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    log_to_stderr(logging.WARNING, "%(name)s: %(levelname)s: %(message)s")
    try:
        path = write_report(args.dir, folds=args.folds, ess=args.ess, seed=args.seed)
    except (ValueError, OSError) as exc:
        print(f"priors_eval: {exc}", file=sys.stderr)
        return 1
    print(path.read_text(encoding="utf-8"))
    print(f"Wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
