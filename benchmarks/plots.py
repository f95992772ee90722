"""The benchmark report's figures, drawn from :func:`benchmarks.report.evaluate`'s results only.

Nothing here trains or scores: every number comes from stored records via the report.
matplotlib is imported only when plotting, with the Agg backend (no display on CI or servers).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

#: The figures :func:`plot_all` writes, in report order.
PLOTS = ("reliability.png", "confusion.png", "accuracy_by_arch.png", "overhead.png")


def plot_all(res: Mapping[str, Any], out: Path, arch_goal: float | None = None, prefix: str = "") -> list[str]:
    """Write the report's PNGs into ``out``; returns the file names written.

    ``res`` is :func:`benchmarks.report.evaluate`'s result; ``arch_goal`` draws the
    per-architecture top-1 target on the accuracy plot; ``prefix`` starts every file name (a
    second suite's figures must not overwrite the first's).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or servers
    import matplotlib.pyplot as plt

    written = []
    figures = (("reliability.png", _plot_reliability), ("confusion.png", _plot_confusion),
               ("accuracy_by_arch.png", lambda r, p: _plot_accuracy(r, p, arch_goal)),
               ("overhead.png", _plot_overhead))
    for name, fn in figures:
        fig = fn(res, plt)
        if fig is None:
            continue
        fig.savefig(out / (prefix + name), dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(prefix + name)
    return written


def plot_suite_reliability(rel: Mapping[str, Mapping[str, Any]], out: Path) -> list[str]:
    """One reliability diagram per suite, ``reliability_<suite>.png``, every predictor a line.

    ``rel`` is ``{suite: {predictor title: reliability table}}`` as
    :func:`benchmarks.side_by_side.compare` returns it (tables with ``count``, ``confidence``,
    ``accuracy``, ``null_lo``, ``null_hi``); the first predictor's null band is drawn. Suites
    without runs are skipped.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for suite, tabs in rel.items():
        tabs = {k: t for k, t in tabs.items() if int(t["count"].sum())}
        if not tabs:
            continue
        fig, ax = plt.subplots(figsize=(5.5, 4.5))
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
        first = next(iter(tabs.values()))
        f = first["count"] > 0
        ax.errorbar(first["confidence"][f], (first["null_lo"] + first["null_hi"])[f] / 2,
                    yerr=((first["null_hi"] - first["null_lo"]) / 2)[f], fmt="none", ecolor="tab:blue",
                    alpha=0.3, lw=6, label=f"95% null band ({next(iter(tabs))})")
        for name, t in tabs.items():
            m = t["count"] > 0
            ax.plot(t["confidence"][m], t["accuracy"][m], "o-", ms=4, label=f"{name} (n={int(t['count'].sum())})")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("confidence of top label")
        ax.set_ylabel("accuracy of top label")
        ax.set_title(f"Reliability, {suite} suite", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
        name = f"reliability_{suite}.png"
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


def _plot_accuracy(res: Mapping[str, Any], plt: Any, goal: float | None) -> Any:
    tabs = res["per_arch"]
    names = list(tabs)
    archs = list(tabs["bayes_net"].index)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(archs) + 2), 4))
    w = 0.8 / len(names)
    x = np.arange(len(archs))
    for k, n in enumerate(names):
        ax.bar(x + (k - (len(names) - 1) / 2) * w, tabs[n].reindex(archs)["top1"], w, label=n)
    if goal is not None:
        ax.axhline(goal, color="black", lw=1, ls=":", label=f"goal {goal}")
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
           yerr=[(t["ratio_median"] - t["ratio_q25"]).clip(lower=0),
                 (t["ratio_q75"] - t["ratio_median"]).clip(lower=0)],
           capsize=3)
    ax.axhline(1.0, color="black", lw=1)
    ax.set_xticks(x, list(t.index), rotation=30, ha="right")
    ax.set_ylabel("monitored / bare wall time (median, IQR)")
    ax.set_title("Monitor overhead per architecture (paired runs)")
    return fig
