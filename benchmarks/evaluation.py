"""Every number of the benchmark report, computed from a records frame (nothing is retrained).

:func:`evaluate` scores the Bayesian network and the rule baselines on the same runs with
:mod:`benchmarks.metrics`; :mod:`benchmarks.report` renders the result as markdown and
:mod:`benchmarks.plots` draws it.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from benchmarks import metrics as M
from benchmarks import verification

log = logging.getLogger("neuraldbg")

#: Predictors in report order: the network, then the baselines (their records columns).
PREDICTORS: dict[str, str | None] = {
    "bayes_net": None,
    "first_event": "baseline_first_event",
    "threshold_rules": "baseline_threshold_rules",
}
#: The benchmark's targets (the Goals table of REPORT.md).
GOAL_TOP1 = 0.90
GOAL_TOP1_ARCH = 0.80
GOAL_FALSE_ALARM = 0.02
#: The verification goals (``run --verify``): top-1 after verification overall and per
#: architecture, and the median replayed steps per run.
GOAL_VERIFIED_TOP1 = 0.95
GOAL_VERIFIED_TOP1_ARCH = 0.90
GOAL_VERIFY_STEPS = 60


# --------------------------------------------------------------------------- evaluation

def usable(df: pd.DataFrame) -> pd.DataFrame:
    """Records of runs that finished (no ``error``) with a posterior."""
    err = df["error"].map(M.is_missing) if "error" in df.columns else pd.Series(True, index=df.index)
    ok = err & pd.to_numeric(df["p_healthy"], errors="coerce").notna()
    return df[ok.to_numpy(dtype=bool)].reset_index(drop=True)


def predictions(df: pd.DataFrame, labels: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    """``{predictor: {"scores": (n, L), "probs": (n, L)}}`` for the network and each baseline."""
    out: dict[str, dict[str, np.ndarray]] = {}
    scores = M.label_scores(df, labels).to_numpy()
    out["bayes_net"] = {"scores": scores, "probs": M.normalize(scores)}
    for name, col in PREDICTORS.items():
        if col is None:
            continue
        if col not in df.columns or df[col].map(M.is_missing).all():
            log.warning("records have no %s column; baseline %s left out", col, name)
            continue
        probs = M.distribution_from_json(df[col], labels)
        out[name] = {"scores": probs, "probs": probs}
    return out


def evaluate(df: pd.DataFrame, null_draws: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Every number of the report, from a records frame (errored runs counted, then left out)."""
    res: dict[str, Any] = {"n_records": int(len(df)), "null_draws": null_draws}
    good = usable(df)
    res["n_errors"] = int(len(df) - len(good))
    res["errors"] = (df.loc[~df["error"].map(M.is_missing).to_numpy(dtype=bool), ["key", "error"]]
                     if "error" in df.columns else pd.DataFrame(columns=["key", "error"]))
    # runs that ran otherwise than written (a CPU fallback) are scored, and listed with why
    noted = df["note"].map(lambda v: not M.is_missing(v) and str(v) != "") if "note" in df.columns else None
    res["notes"] = (df.loc[noted.to_numpy(dtype=bool), ["key", "note"]] if noted is not None
                    else pd.DataFrame(columns=["key", "note"]))
    labels = M.labels_from_columns(good.columns)
    res["labels"] = labels
    y_lab = M.true_labels(good) if len(good) else pd.Series([], dtype=object)
    y = M.label_index(y_lab, labels)
    preds = predictions(good, labels)
    healthy = (y_lab == M.HEALTHY).to_numpy(dtype=bool)
    res["n_runs"] = int(len(good))
    res["n_healthy"] = int(healthy.sum())
    res["n_injected"] = int((~healthy).sum())

    overall, per_arch, per_family = {}, {}, {}
    for name, p in preds.items():
        s = M.score_distribution(p["probs"], y, p["scores"], null_draws=null_draws, seed=seed)
        alarms = (M.bn_alarms(good) if name == "bayes_net"
                  else M.distribution_alarms(p["probs"], labels.index(M.HEALTHY)))
        fa = M.false_alarm_rate(alarms[healthy])
        s.update(false_alarm=fa["rate"], false_alarm_upper=fa["upper"], false_alarms=fa["alarms"])
        # accuracy on injected runs alone: what a user with a broken run sees
        s["top1_injected"] = M.accuracy(p["scores"][~healthy], y[~healthy], 1) if (~healthy).any() else math.nan
        if name == "bayes_net":
            # the engine's own answer: its top reported hypothesis, healthy when none is reported
            said = [M.label_of(c, st) for c, st in zip(good["pred_cause"], good["pred_state"])]
            s["top1_reported"] = float(np.mean(np.array(said, dtype=object) == y_lab.to_numpy(dtype=object))) \
                if len(good) else math.nan
        overall[name] = s
        per_arch[name] = M.grouped_accuracy(p["scores"], y, good["arch"])
        per_family[name] = _family_table(good, p, y)
    res["overall"] = pd.DataFrame(overall).T
    res["per_arch"] = per_arch
    res["per_family"] = per_family

    bn = preds["bayes_net"]
    pred_idx, conf = M.top_label(bn["probs"])
    res["pred_labels"] = [labels[i] for i in pred_idx]
    res["true_labels"] = list(y_lab)
    res["confusion"] = M.confusion_matrix(y_lab, res["pred_labels"], labels)
    res["reliability"] = pd.concat([M.reliability_table(conf, pred_idx == y),
                                    M.reliability_null_band(conf, draws=null_draws, seed=seed)], axis=1)
    res["per_injection"] = _injection_table(good, res["pred_labels"], pred_idx == y)
    res["localization"] = M.localization(good[~healthy]) if (~healthy).any() else {}
    res["overhead"] = overhead_table(good)
    try:  # run --verify: before/after scores; the rest of the report never depends on them
        res["verification"] = verification.evaluate(good)
    except Exception as exc:
        log.warning("verification scores could not be computed: %s", exc)
        res["verification"] = {"n": 0, "why": f"{type(exc).__name__}: {exc}"}
    res["unsupported"] = unsupported_answers(good)
    res["goals"] = goals(res)
    return res


def unsupported_answers(df: pd.DataFrame) -> tuple[int, int] | None:
    """``(top hypotheses above 0.5 that no observation of their own favours, top hypotheses
    above 0.5)``; ``None`` for records made before ``pred_evidence`` was recorded."""
    if "pred_evidence" not in df.columns or "pred_prob" not in df.columns:
        return None
    p = pd.to_numeric(df["pred_prob"], errors="coerce")
    above = p > 0.5
    bare = df["pred_evidence"].fillna("").astype(str).str.strip() == ""
    return int((above & bare).sum()), int(above.sum())


def _family_table(df: pd.DataFrame, p: Mapping[str, np.ndarray], y: np.ndarray) -> pd.DataFrame:
    fam = df["family"].fillna("?").astype(str).to_numpy() if "family" in df.columns else np.full(len(df), "?")
    rows = []
    for f in sorted(set(fam)):
        m = fam == f
        rows.append({"family": f, "n": int(m.sum()),
                     "top1": M.accuracy(p["scores"][m], y[m], 1), "top3": M.accuracy(p["scores"][m], y[m], 3),
                     "brier": M.brier(p["probs"][m], y[m]), "log_loss": M.log_loss(p["probs"][m], y[m])})
    return pd.DataFrame(rows).set_index("family") if rows else pd.DataFrame()


def _injection_table(df: pd.DataFrame, pred: Sequence[str], correct: np.ndarray) -> pd.DataFrame:
    t = pd.DataFrame({"arch": df["arch"], "injection": df["injection"], "true": M.true_labels(df),
                      "pred": list(pred), "correct": correct})
    rows = []
    for (a, i), g in t.groupby(["arch", "injection"], sort=True):
        common = g["pred"].value_counts()
        rows.append({"arch": a, "injection": i, "truth": g["true"].iloc[0], "n": len(g),
                     "top1": float(g["correct"].mean()),
                     "most_predicted": f"{common.index[0]} ({common.iloc[0]}/{len(g)})"})
    return pd.DataFrame(rows)


def overhead_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per architecture: median of paired ``seconds / seconds_bare`` and the median times."""
    s = pd.to_numeric(df["seconds"], errors="coerce")
    b = pd.to_numeric(df["seconds_bare"], errors="coerce")
    m = s.notna() & b.notna() & (b > 0)
    t = pd.DataFrame({"arch": df["arch"][m], "ratio": (s / b)[m], "seconds": s[m], "seconds_bare": b[m]})
    if t.empty:
        return pd.DataFrame(columns=["pairs", "ratio_median", "ratio_q25", "ratio_q75", "seconds", "seconds_bare"])
    g = t.groupby("arch")
    return pd.DataFrame({
        "pairs": g.size(), "ratio_median": g["ratio"].median(), "ratio_q25": g["ratio"].quantile(0.25),
        "ratio_q75": g["ratio"].quantile(0.75), "seconds": g["seconds"].median(),
        "seconds_bare": g["seconds_bare"].median(),
    })


def goals(res: Mapping[str, Any]) -> pd.DataFrame:
    """The benchmark's goals with the measured value and PASS / FAIL (``n/a`` when unmeasurable)."""
    ov = res["overall"]
    bn = ov.loc["bayes_net"] if "bayes_net" in ov.index else pd.Series(dtype=float)
    arch = res["per_arch"].get("bayes_net")
    worst = arch.drop(index="overall")["top1"] if arch is not None and len(arch) > 1 else pd.Series(dtype=float)
    rows = [
        ("top-1 overall >= 0.90", fmt(bn.get("top1")), _verdict(bn.get("top1"), lambda v: v >= GOAL_TOP1)),
        ("top-1 every architecture >= 0.80",
         f"min {fmt(worst.min())} ({worst.idxmin()})" if len(worst) else "n/a",
         _verdict(worst.min() if len(worst) else None, lambda v: v >= GOAL_TOP1_ARCH)),
        ("ECE within the null band",
         f"{fmt(bn.get('ece'))} vs band [{fmt(bn.get('ece_null_lo'))}, {fmt(bn.get('ece_null_hi'))}]",
         _verdict(bn.get("ece"), lambda v: v <= bn.get("ece_null_hi"))),
        ("healthy false-alarm rate <= 0.02",
         f"{fmt(bn.get('false_alarm'))} ({int(bn.get('false_alarms', 0) or 0)}/{res['n_healthy']}; "
         f"95% upper bound {fmt(bn.get('false_alarm_upper'))})",
         _verdict(bn.get("false_alarm") if res["n_healthy"] else None, lambda v: v <= GOAL_FALSE_ALARM)),
    ]
    own = res.get("unsupported")
    rows.append(("no hypothesis above 0.5 without evidence of its own",
                 f"{own[0]} of {own[1]}" if own else "n/a (records without pred_evidence)",
                 "n/a" if not own else ("PASS" if own[0] == 0 else "FAIL")))
    rows += _verification_goals(res.get("verification") or {})
    for base in [p for p in PREDICTORS if p != "bayes_net"]:
        if base not in ov.index:
            rows.append((f"beats {base} on top-1 and log loss", "baseline missing", "n/a"))
            continue
        b = ov.loc[base]
        val = (f"top-1 {fmt(bn.get('top1'))} vs {fmt(b['top1'])}; "
               f"log loss {fmt(bn.get('log_loss'))} vs {fmt(b['log_loss'])}")
        ok = None if _nan(bn.get("top1")) else (bn["top1"] > b["top1"] and bn["log_loss"] < b["log_loss"])
        rows.append((f"beats {base} on top-1 and log loss", val, "n/a" if ok is None else ("PASS" if ok else "FAIL")))
    return pd.DataFrame(rows, columns=["goal", "measured", "verdict"])


def _verification_goals(v: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    if not v.get("n"):
        return []
    pa = v["per_arch"]
    ov, arch = pa.loc["overall"], pa.drop(index="overall")
    worst = arch["top1_after"].idxmin()
    fa = v["false_alarms"]
    return [
        (f"top-1 after verification >= {GOAL_VERIFIED_TOP1}",
         f"{fmt(ov['top1_after'])} (before {fmt(ov['top1_before'])}; held-out folds {fmt(ov['top1_after_cv'])})",
         _verdict(ov["top1_after"], lambda x: x >= GOAL_VERIFIED_TOP1)),
        (f"top-1 after verification every architecture >= {GOAL_VERIFIED_TOP1_ARCH}",
         f"min {fmt(arch.loc[worst, 'top1_after'])} ({worst})",
         _verdict(arch.loc[worst, "top1_after"], lambda x: x >= GOAL_VERIFIED_TOP1_ARCH)),
        ("no healthy run turned into a false alarm by verification",
         f"{int(fa.loc['after', 'new_alarms'])} of {v['n_healthy']} "
         f"(held-out folds {int(fa.loc['after_cv', 'new_alarms'])})",
         "PASS" if fa.loc["after", "new_alarms"] == 0 else "FAIL"),
        (f"median extra steps per run <= {GOAL_VERIFY_STEPS}", fmt(v["extra_steps_median"], 0),
         _verdict(v["extra_steps_median"], lambda x: x <= GOAL_VERIFY_STEPS)),
    ]


def _nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _verdict(v: Any, test: Any) -> str:
    if _nan(v):
        return "n/a"
    return "PASS" if bool(test(float(v))) else "FAIL"


def fmt(v: Any, nd: int = 3) -> str:
    """A table cell: ``n/a`` for missing, yes/no for booleans, ``nd`` decimals for floats."""
    if _nan(v):
        return "n/a"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.{nd}f}"
    return str(v)
