"""``python -m benchmarks report DIR``: scores and plots from stored benchmark records only.

Reads ``DIR/records.parquet`` (or ``records.csv``), never retrains, and writes ``DIR/REPORT.md``
plus PNG plots beside it (``reliability.png``, ``confusion.png``, ``accuracy_by_arch.png``,
``overhead.png``). ``--publish docs/benchmark.md`` also copies the report and its images under
``docs/`` for the README to link.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from benchmarks import metrics as M
from benchmarks.harness import load_records

log = logging.getLogger("neuraldbg")

#: Predictors in report order: the network, then the baselines (their records columns).
PREDICTORS: dict[str, str | None] = {
    "bayes_net": None,
    "first_event": "baseline_first_event",
    "threshold_rules": "baseline_threshold_rules",
}
#: Goals of issue 5.
GOAL_TOP1 = 0.90
GOAL_TOP1_ARCH = 0.80
GOAL_FALSE_ALARM = 0.02
PLOTS = ("reliability.png", "confusion.png", "accuracy_by_arch.png", "overhead.png")


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
    res["goals"] = goals(res)
    return res


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
    """The goals of issue 5 with the measured value and PASS / FAIL (``n/a`` when unmeasurable)."""
    ov = res["overall"]
    bn = ov.loc["bayes_net"] if "bayes_net" in ov.index else pd.Series(dtype=float)
    arch = res["per_arch"].get("bayes_net")
    worst = arch.drop(index="overall")["top1"] if arch is not None and len(arch) > 1 else pd.Series(dtype=float)
    rows = [
        ("top-1 overall >= 0.90", _fmt(bn.get("top1")), _verdict(bn.get("top1"), lambda v: v >= GOAL_TOP1)),
        ("top-1 every architecture >= 0.80",
         f"min {_fmt(worst.min())} ({worst.idxmin()})" if len(worst) else "n/a",
         _verdict(worst.min() if len(worst) else None, lambda v: v >= GOAL_TOP1_ARCH)),
        ("ECE within the null band",
         f"{_fmt(bn.get('ece'))} vs band [{_fmt(bn.get('ece_null_lo'))}, {_fmt(bn.get('ece_null_hi'))}]",
         _verdict(bn.get("ece"), lambda v: v <= bn.get("ece_null_hi"))),
        ("healthy false-alarm rate <= 0.02",
         f"{_fmt(bn.get('false_alarm'))} ({int(bn.get('false_alarms', 0) or 0)}/{res['n_healthy']}; "
         f"95% upper bound {_fmt(bn.get('false_alarm_upper'))})",
         _verdict(bn.get("false_alarm") if res["n_healthy"] else None, lambda v: v <= GOAL_FALSE_ALARM)),
    ]
    for base in [p for p in PREDICTORS if p != "bayes_net"]:
        if base not in ov.index:
            rows.append((f"beats {base} on top-1 and log loss", "baseline missing", "n/a"))
            continue
        b = ov.loc[base]
        val = (f"top-1 {_fmt(bn.get('top1'))} vs {_fmt(b['top1'])}; "
               f"log loss {_fmt(bn.get('log_loss'))} vs {_fmt(b['log_loss'])}")
        ok = None if _nan(bn.get("top1")) else (bn["top1"] > b["top1"] and bn["log_loss"] < b["log_loss"])
        rows.append((f"beats {base} on top-1 and log loss", val, "n/a" if ok is None else ("PASS" if ok else "FAIL")))
    return pd.DataFrame(rows, columns=["goal", "measured", "verdict"])


def _nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _verdict(v: Any, test: Any) -> str:
    if _nan(v):
        return "n/a"
    return "PASS" if bool(test(float(v))) else "FAIL"


def _fmt(v: Any, nd: int = 3) -> str:
    if _nan(v):
        return "n/a"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.{nd}f}"
    return str(v)


# --------------------------------------------------------------------------- plots

def plot_all(res: Mapping[str, Any], out: Path) -> list[str]:
    """Write the report's PNGs into ``out``; returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or servers
    import matplotlib.pyplot as plt

    written = []
    for name, fn in (("reliability.png", _plot_reliability), ("confusion.png", _plot_confusion),
                     ("accuracy_by_arch.png", _plot_accuracy), ("overhead.png", _plot_overhead)):
        fig = fn(res, plt)
        if fig is None:
            continue
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(name)
    return written


def _plot_reliability(res: Mapping[str, Any], plt: Any) -> Any:
    rt = res["reliability"]
    fig, (ax, axh) = plt.subplots(2, 1, figsize=(5.5, 6), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    mid = (rt["lo"] + rt["hi"]) / 2
    filled = rt["count"] > 0
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
    ax.errorbar(rt["confidence"][filled], (rt["null_lo"] + rt["null_hi"])[filled] / 2,
                yerr=((rt["null_hi"] - rt["null_lo"]) / 2)[filled], fmt="none", ecolor="tab:blue",
                alpha=0.35, lw=6, label="95% null band (calibrated model)")
    ax.plot(rt["confidence"][filled], rt["accuracy"][filled], "o-", color="tab:red", label="Bayesian network")
    ov = res["overall"].loc["bayes_net"]
    ax.set_title(f"Reliability (ECE {ov['ece']:.3f}, null band "
                 f"[{ov['ece_null_lo']:.3f}, {ov['ece_null_hi']:.3f}])", fontsize=10)
    ax.set_ylabel("accuracy of top label")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8, loc="upper left")
    axh.bar(mid, rt["count"], width=1 / len(rt), color="tab:grey", edgecolor="white")
    axh.set_xlabel("confidence of top label")
    axh.set_ylabel("runs")
    return fig


def _plot_confusion(res: Mapping[str, Any], plt: Any) -> Any:
    cm = res["confusion"]
    fig, ax = plt.subplots(figsize=(7, 6))
    counts = cm.to_numpy()
    # colour by share of the row so rare truths stay readable beside the many healthy runs
    share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(cm.columns)), [c.replace("/", "/\n") for c in cm.columns], rotation=90, fontsize=8)
    ax.set_yticks(range(len(cm.index)), list(cm.index), fontsize=8)
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            v = counts[i, j]
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                        color="white" if share[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted (Bayesian network, top-1)")
    ax.set_ylabel("injected truth")
    ax.set_title("Confusion matrix (counts; colour: share of the row)")
    return fig


def _plot_accuracy(res: Mapping[str, Any], plt: Any) -> Any:
    tabs = res["per_arch"]
    names = list(tabs)
    archs = list(tabs["bayes_net"].index)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(archs) + 2), 4))
    w = 0.8 / len(names)
    x = np.arange(len(archs))
    for k, n in enumerate(names):
        ax.bar(x + (k - (len(names) - 1) / 2) * w, tabs[n].reindex(archs)["top1"], w, label=n)
    ax.axhline(GOAL_TOP1_ARCH, color="black", lw=1, ls=":", label=f"goal {GOAL_TOP1_ARCH}")
    ax.set_xticks(x, archs, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("top-1 accuracy")
    ax.set_title("Top-1 root-cause accuracy per architecture")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, ncol=len(names) + 1, loc="lower center",
               bbox_to_anchor=(0.5, -0.02), frameon=False)
    fig.subplots_adjust(bottom=0.3)
    return fig


def _plot_overhead(res: Mapping[str, Any], plt: Any) -> Any:
    t = res["overhead"]
    if t.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(t) + 2), 4))
    x = np.arange(len(t))
    ax.bar(x, t["ratio_median"], color="tab:orange",
           yerr=[(t["ratio_median"] - t["ratio_q25"]).clip(lower=0), (t["ratio_q75"] - t["ratio_median"]).clip(lower=0)],
           capsize=3)
    ax.axhline(1.0, color="black", lw=1)
    ax.set_xticks(x, list(t.index), rotation=30, ha="right")
    ax.set_ylabel("monitored / bare wall time (median, IQR)")
    ax.set_title("Monitor overhead per architecture (paired runs)")
    return fig


# --------------------------------------------------------------------------- markdown

def _md_table(df: pd.DataFrame, index: bool = True, floatfmt: int = 3) -> str:
    if df is None or len(df) == 0:
        return "_none_\n"
    d = df.reset_index() if index else df
    cols = [str(c) for c in d.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for row in d.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v, floatfmt) for v in row) + " |")
    return "\n".join(lines) + "\n"


def _provenance(dir_: Path) -> dict[str, str]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, timeout=10,
                                  cwd=Path(__file__).resolve().parent).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "uncommitted"
    dirty = " (with local changes)" if git("status", "--porcelain") else ""
    meta = {}
    mpath = dir_ / "run_meta.json"
    if mpath.exists():
        try:
            meta = json.loads(mpath.read_text())
        except ValueError:
            meta = {}
    return {"commit": commit + dirty, "command": meta.get("command", "python -m benchmarks run ..."),
            "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "host": meta.get("host", "")}


def render(res: Mapping[str, Any], dir_: Path, images: Sequence[str], img_prefix: str = "") -> str:
    """The REPORT.md text."""
    prov = _provenance(dir_)
    ov = res["overall"]
    cols = ["n", "top1", "top3", "top1_injected", "top1_reported", "ece", "ece_null_lo", "ece_null_hi", "brier", "log_loss",
            "false_alarm", "false_alarm_upper", "mean_confidence"]
    arch = pd.DataFrame({n: t["top1"] for n, t in res["per_arch"].items()})
    arch.insert(0, "n", res["per_arch"]["bayes_net"]["n"])
    arch.insert(2, "bayes_net_top3", res["per_arch"]["bayes_net"]["top3"])
    arch = arch.rename(columns={n: f"{n}_top1" for n in res["per_arch"]})
    fam = res["per_family"]["bayes_net"].copy()
    for n, t in res["per_family"].items():
        if n != "bayes_net" and len(t):
            fam[f"{n}_top1"] = t["top1"]
            fam[f"{n}_log_loss"] = t["log_loss"]
    loc = res["localization"]
    parts = [
        "# NeuralDBG failure-injection benchmark\n",
        f"Produced by `{prov['command']}` then `python -m benchmarks report {dir_}` at commit "
        f"`{prov['commit']}`, {prov['date']}{(', on ' + prov['host']) if prov['host'] else ''}.\n",
        f"{res['n_records']} runs recorded, {res['n_errors']} errored (left out below); scored: "
        f"{res['n_runs']} runs, {res['n_injected']} injected and {res['n_healthy']} healthy.\n",
        "## Goals\n", _md_table(res["goals"], index=False),
        "## Overall: the Bayesian network beside the rule baselines\n",
        "All three read the same exported traces. `top1_injected` is top-1 on injected runs only; "
        "`top1_reported` scores the engine's own top hypothesis (healthy when it reports none) instead "
        "of the argmax rule; "
        "`false_alarm` is measured on healthy runs (`false_alarm_upper`: exact one-sided 95% bound); "
        "`ece_null_lo/hi`: the 95% band of ECE for a perfectly calibrated predictor with the same "
        "confidences.\n",
        _md_table(ov[[c for c in cols if c in ov.columns]].rename_axis("predictor")),
        "## Per architecture (top-1; bayes_net also top-3)\n", _md_table(arch),
        "## Per family (shipped priors)\n",
        "Scores of the shipped hand-set priors per family. Priors fitted on other folds and on other "
        "architectures (leave-one-architecture-out) are in the prior-tuning section below when it "
        "could be computed.\n",
        _md_table(fam),
        res.get("priors_md") or ("## Prior tuning and generalization\n\n_not computed: "
                                 f"{res.get('priors_why', 'disabled')}_\n"),
        "## Per injection (Bayesian network)\n", _md_table(res["per_injection"], index=False),
        "## Confusion matrix (rows: injected truth, columns: top-1 prediction)\n", _md_table(res["confusion"]),
        "## Localization\n",
        (f"Origin layer equals the injected layer in {_fmt(loc.get('layer_acc'))} of {loc.get('layer_n', 0)} "
         f"runs whose injection names a layer. Onset error (detected - injected step) over "
         f"{loc.get('onset_n', 0)} runs: mean {_fmt(loc.get('onset_mean_err'), 1)}, median |error| "
         f"{_fmt(loc.get('onset_median_abs_err'), 1)}, within 5 steps {_fmt(loc.get('onset_within_5'))}; "
         f"{loc.get('onset_missing', 0)} injected runs with a known onset had no detected one.\n"
         if loc else "_no injected runs_\n"),
        "## Overhead (monitored / bare wall time, paired runs in one process)\n", _md_table(res["overhead"]),
        "## Reliability table (Bayesian network)\n",
        _md_table(res["reliability"][res["reliability"]["count"] > 0], index=False),
    ]
    if len(res["errors"]):
        parts += ["## Errored runs\n", _md_table(res["errors"], index=False)]
    if images:
        parts.append("## Plots\n")
        parts += [f"![{Path(i).stem}]({img_prefix}{i})\n" for i in images]
    parts += ["## How to read this\n", METHOD.format(draws=res.get("null_draws", 2000))]
    return "\n".join(parts)


METHOD = """\
- Labels: `healthy` or one abnormal root state `variable/state`. The network's score of a label is
  P(healthy) for `healthy` and the posterior marginal P(variable = state) otherwise; top-1 is the
  highest score (ties: `healthy` first, then API.md order), top-3 the three highest. Dividing the
  scores by their sum gives the distribution used for ECE, Brier (multi-class, 0..2) and log loss
  (probabilities clipped at 1e-6).
- ECE: top label, 15 equal-width bins. Its null band comes from {draws} draws of labels from the
  model's own predicted distribution; an ECE at or below the band's top is consistent with a
  perfectly calibrated model at this sample size.
- False alarm (network): a healthy run with any reported hypothesis (above the engine's
  reporting floor) or P(healthy) < 0.5. For a baseline: a failure label on top or q(healthy) < 0.5.
- Baselines: `first_event` maps the first event's kind to one cause with a fixed confidence
  (earlier NeuralDBG releases); `threshold_rules` are AutoTrainer / SageMaker Debugger style
  yes/no rules (VanishingGradient, ExplodingTensor, LossNotDecreasing, ...) voting for the
  causes their documentation suggests. Both are defined in `benchmarks/baselines.py`.
- Overhead: the same run trained with and without the monitor back to back in one worker
  process (one torch thread), which goes first alternating across runs; median of the ratios.
"""


# --------------------------------------------------------------------------- entry points

def priors_section(dir_: Path) -> tuple[str | None, str]:
    """K-fold and leave-one-architecture-out prior scores (``benchmarks.priors_eval``) as markdown.

    Returns ``(markdown, "")`` or ``(None, reason)`` when the tuning code or the sessions are
    missing or the evaluation fails: the rest of the report never depends on it.
    """
    try:
        from benchmarks import priors_eval
    except Exception as exc:  # the prior-tuning code is optional for the report
        return None, f"prior tuning unavailable ({type(exc).__name__}: {exc})"
    try:
        text = priors_eval.render(priors_eval.evaluate(dir_), dir_)
    except Exception as exc:
        log.warning("prior-tuning evaluation of %s failed: %s", dir_, exc)
        return None, f"evaluation failed ({type(exc).__name__}: {exc})"
    # its headings sit one level below the report's
    lines = []
    for line in text.splitlines():
        if line.startswith("# "):
            line = "## Prior tuning and generalization (held-out verification)"
        elif line.startswith("#"):
            line = "#" + line
        lines.append(line)
    return "\n".join(lines) + "\n", ""


def write_report(dir_: str | Path, publish: str | Path | None = None, null_draws: int = 2000,
                 plots: bool = True, priors: bool = True) -> Path:
    """Score the records in ``dir_`` and write ``dir_/REPORT.md`` and its plots; returns its path."""
    dir_ = Path(dir_)
    if not dir_.is_dir():
        raise FileNotFoundError(f"benchmark folder {dir_} does not exist")
    df = load_records(dir_)
    if len(df) == 0:
        raise ValueError(f"no benchmark records in {dir_}")
    res = evaluate(df, null_draws=null_draws)
    if res["n_runs"] == 0:
        raise ValueError(f"all {len(df)} runs in {dir_} errored; first error: {df['error'].iloc[0]}")
    if priors:
        res["priors_md"], res["priors_why"] = priors_section(dir_)
    images = plot_all(res, dir_) if plots else []
    path = dir_ / "REPORT.md"
    path.write_text(render(res, dir_, images))
    (dir_ / "summary.json").write_text(json.dumps(
        {"overall": json.loads(res["overall"].to_json(orient="index")),
         "goals": res["goals"].to_dict(orient="records"), "n_runs": res["n_runs"],
         "n_errors": res["n_errors"]}, indent=1))
    if publish:
        pub = Path(publish)
        img_dir = pub.with_suffix("")  # docs/benchmark.md -> docs/benchmark/
        img_dir.mkdir(parents=True, exist_ok=True)
        for i in images:
            shutil.copy(dir_ / i, img_dir / i)
        publish_markdown(pub, render(res, dir_, images, img_prefix=f"{img_dir.name}/"))
    return path


MARK_START = "<!-- benchmark-report:start -->"
MARK_END = "<!-- benchmark-report:end -->"


def publish_markdown(path: Path, text: str) -> None:
    """Write ``text`` to ``path``; between the report markers when the file has them.

    That lets a hand-written guide (``docs/benchmark.md``) carry the latest generated report
    without the two being edited in one place.
    """
    old = path.read_text() if path.exists() else ""
    if MARK_START in old and MARK_END in old:
        head, rest = old.split(MARK_START, 1)
        _, tail = rest.split(MARK_END, 1)
        # one heading level down, under the guide's own title
        body = re.sub(r"(?m)^(#+) ", r"#\1 ", text)
        body = body.replace("## NeuralDBG failure-injection benchmark", "## Latest results", 1)
        path.write_text(f"{head}{MARK_START}\n{body}\n{MARK_END}{tail}")
    else:
        path.write_text(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks report``."""
    p.add_argument("dir", help="benchmark output folder (with records.csv or records.parquet)")
    p.add_argument("--publish", metavar="MD", help="also write this markdown copy (images in a folder beside it)")
    p.add_argument("--null-draws", type=int, default=2000, help="draws of the ECE null band (default %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--no-priors", action="store_true",
                   help="skip the prior-tuning section (k-fold and leave-one-architecture-out refits)")


def main(args: argparse.Namespace) -> int:
    """Write the report for parsed ``args``."""
    path = write_report(args.dir, publish=args.publish, null_draws=args.null_draws, plots=not args.no_plots,
                        priors=not args.no_priors)
    summ = json.loads((Path(args.dir) / "summary.json").read_text())
    print(f"wrote {path}")
    for g in summ["goals"]:
        print(f"  {g['verdict']:4}  {g['goal']}: {g['measured']}")
    return 0
