"""``python -m benchmarks report DIR [DIR2 ...]``: scores and plots from stored benchmark records only.

Reads each folder's ``records.parquet`` (or ``records.csv``) and exported sessions, never
retrains a model, and writes into the first folder ``REPORT.md`` plus PNG plots beside it
(``reliability.png``, ``confusion.png``, ``accuracy_by_arch.png``, ``overhead.png``; another
suite's carry its name as a prefix, ``ecosystem_reliability.png``). The headline is the suites
side by side (:mod:`benchmarks.side_by_side`: ``suites.csv``, ``suites.json``,
``reliability_<suite>.png``); then the zoo's sections as before, then every other suite's. The
suites may share a folder (the ``suite`` column tells them apart; records without it are the
zoo's) or come in separate ones. ``--publish docs/benchmark.md`` also copies the report and its
images under ``docs/`` for the README to link. The numbers come from :mod:`benchmarks.evaluation`,
the figures from :mod:`benchmarks.plots`; this module writes the markdown.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from benchmarks import side_by_side, verification
from benchmarks.evaluation import (GOAL_FALSE_ALARM, GOAL_TOP1, GOAL_TOP1_ARCH, PREDICTORS, evaluate, fmt, goals,
                                   overhead_table, predictions, usable)
from benchmarks.metrics import is_missing
from benchmarks.plots import PLOTS, plot_all, plot_suite_reliability
from benchmarks.records import LEGACY_SUITE, load_records

log = logging.getLogger("neuraldbg")

# the evaluation's and the plots' public names stay importable from here, where they used to live
__all__ = [
    "GOAL_FALSE_ALARM", "GOAL_TOP1", "GOAL_TOP1_ARCH", "MARK_END", "MARK_START", "METHOD", "PLOTS",
    "PREDICTORS", "add_arguments", "evaluate", "goals", "headline", "main", "overhead_table", "plot_all",
    "predictions", "priors_section", "sections", "publish_markdown", "render", "usable", "write_report",
]


# --------------------------------------------------------------------------- markdown

def _md_table(df: pd.DataFrame, index: bool = True, floatfmt: int = 3) -> str:
    if df is None or len(df) == 0:
        return "_none_\n"
    d = df.reset_index() if index else df
    cols = [str(c) for c in d.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for row in d.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v, floatfmt) for v in row) + " |")
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


def code_line(df: pd.DataFrame) -> str:
    """Which code made the records of ``df`` (their ``code``, ``neuraldbg/source.py``): one
    version, several (a folder resumed with ``--keep-stale``), or not said (older records)."""
    codes = df["code"] if "code" in df.columns else pd.Series([], dtype=str)
    if codes.isna().all():
        return "The records do not say which code made them."
    counts = codes.fillna("not said").value_counts()
    if len(counts) == 1:
        return f"Every record was made by code `{counts.index[0]}` (`neuraldbg/source.py`)."
    parts = ", ".join(f"`{c}` {n}" for c, n in counts.items())
    return (f"**The records were made by {len(counts)} versions of the code** ({parts}; `neuraldbg/source.py`): "
            "a folder resumed with `--keep-stale` mixes their events.")


def render(res: Mapping[str, Any], dir_: Path, images: Sequence[str], img_prefix: str = "",
           headline: str = "", more: Sequence[str] = (), others: Sequence[Path] = (), code: str = "") -> str:
    """The REPORT.md text: provenance, the ``headline`` (the suites side by side), the sections
    of ``res`` (one suite's :func:`evaluate`), then ``more`` (other suites' sections); ``code``: the
    line of :func:`code_line` on every folder's records;
    ``others``: further folders the report read."""
    prov = _provenance(dir_)
    parts = [
        "# NeuralDBG failure-injection benchmark\n",
        f"Produced by `{prov['command']}` then `python -m benchmarks report "
        f"{' '.join(str(d) for d in (dir_, *others))}` at commit "
        f"`{prov['commit']}`, {prov['date']}{(', on ' + prov['host']) if prov['host'] else ''}. "
        f"{code}\n",
    ]
    if headline:
        parts.append(headline)
    if more:
        parts.append(f"## {res.get('suite', 'zoo').capitalize()} suite\n")
    parts += sections(res, images, img_prefix, level=3 if more else 2)
    parts += list(more)
    parts += ["## How to read this\n", METHOD.format(draws=res.get("null_draws", 2000))]
    return "\n".join(parts)


def sections(res: Mapping[str, Any], images: Sequence[str], img_prefix: str = "", level: int = 2) -> list[str]:
    """One suite's sections (goals to plots) with ``level``-deep headings."""
    ov = res["overall"]
    cols = ["n", "top1", "top3", "top1_injected", "top1_reported", "ece", "ece_null_lo", "ece_null_hi", "brier",
            "log_loss", "false_alarm", "false_alarm_upper", "mean_confidence"]
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
        verification.render(res.get("verification") or {}, res.get("suite", LEGACY_SUITE)),
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
        (f"Origin layer equals the injected layer in {fmt(loc.get('layer_acc'))} of {loc.get('layer_n', 0)} "
         f"runs whose injection names a layer. Onset error (detected - injected step) over "
         f"{loc.get('onset_n', 0)} runs: mean {fmt(loc.get('onset_mean_err'), 1)}, median |error| "
         f"{fmt(loc.get('onset_median_abs_err'), 1)}, within 5 steps {fmt(loc.get('onset_within_5'))}; "
         f"{loc.get('onset_missing', 0)} injected runs with a known onset had no detected one.\n"
         if loc else "_no injected runs_\n"),
        "## Overhead (monitored / bare wall time, paired runs in one process)\n", _md_table(res["overhead"]),
        "## Reliability table (Bayesian network)\n",
        _md_table(res["reliability"][res["reliability"]["count"] > 0], index=False),
    ]
    if len(res["errors"]):
        parts += ["## Errored runs\n", _md_table(res["errors"], index=False)]
    if len(res.get("notes", ())):
        parts += ["## Runs with a note (scored above; what ran otherwise than written)\n",
                  _md_table(res["notes"], index=False)]
    if images:
        parts.append("## Plots\n")
        parts += [f"![{Path(i).stem}]({img_prefix}{i})\n" for i in images]
    # the markdown above is written at level 2; a suite nested under its own heading goes deeper
    shift = "#" * (level - 2)
    return [re.sub(r"(?m)^(##+) ", lambda m: m.group(1) + shift + " ", p) for p in parts]


METHOD = """\
- Labels: `healthy` or one abnormal root state `variable/state`. The network's score of a label is
  P(healthy) for `healthy` and the posterior marginal P(variable = state) otherwise; top-1 is the
  highest score (ties: `healthy` first, then docs/api.md order), top-3 the three highest. Dividing the
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

def priors_section(dir_: Path, res: Mapping[str, Any] | None = None) -> tuple[str | None, str]:
    """K-fold and leave-one-architecture-out prior scores (``benchmarks.priors_eval``) as markdown.

    ``res`` is a :func:`benchmarks.priors_eval.evaluate` result already computed (the side-by-side
    section computes it on the zoo runs); without it the runs of ``dir_`` are evaluated.
    Returns ``(markdown, "")`` or ``(None, reason)`` when the tuning code or the sessions are
    missing or the evaluation fails: the rest of the report never depends on it.
    """
    try:
        from benchmarks import priors_eval
    except Exception as exc:  # the prior-tuning code is optional for the report
        return None, f"prior tuning unavailable ({type(exc).__name__}: {exc})"
    try:
        text = priors_eval.render(res if res is not None else priors_eval.evaluate(dir_), dir_)
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


def _suite_column(df: pd.DataFrame) -> pd.Series:
    s = df["suite"] if "suite" in df.columns else pd.Series(None, index=df.index, dtype=object)
    return s.where(~s.map(is_missing), LEGACY_SUITE).astype(str)


def headline(dirs: Sequence[Path], out: Path, null_draws: int, plots: bool) -> tuple[str, list[str], dict]:
    """The side-by-side section, its files (``suites.csv``/``.json``, reliability PNGs) and its
    numbers; a failure becomes a note in the section, never a failed report."""
    try:
        sb = side_by_side.compare(dirs, null_draws=null_draws)
    except Exception as exc:
        log.warning("side-by-side evaluation failed: %s", exc)
        return f"## Suites side by side\n\n_not computed: {type(exc).__name__}: {exc}_\n", [], {}
    side_by_side.write_tables(sb, out)
    images = plot_suite_reliability(sb["reliability"], out) if plots else []
    md = side_by_side.render(sb) + "".join(f"\n![{Path(i).stem}]({{prefix}}{i})\n" for i in images)
    return md, images, sb


def write_report(dir_: str | Path | Sequence[str | Path], publish: str | Path | None = None, null_draws: int = 2000,
                 plots: bool = True, priors: bool = True, suites: bool = True) -> Path:
    """Score the records in ``dir_`` (one folder or several) and write ``REPORT.md``, its plots and
    ``suites.csv``/``suites.json`` into the first; returns the report's path.

    The headline compares the suites side by side (:mod:`benchmarks.side_by_side`); below it the
    zoo's sections as before (or the only suite's), then every other suite's.
    """
    dirs = [Path(dir_)] if isinstance(dir_, (str, Path)) else [Path(d) for d in dir_]
    for d in dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"benchmark folder {d} does not exist")
    out = dirs[0]
    df = pd.concat([load_records(d) for d in dirs], ignore_index=True)
    if len(df) == 0:
        raise ValueError(f"no benchmark records in {', '.join(map(str, dirs))}")
    df["suite"] = _suite_column(df)
    code = code_line(df)  # every folder's records, read once
    names = sorted(df["suite"].unique(), key=lambda s: (s != LEGACY_SUITE, s))
    results = {}
    for name in names:
        r = evaluate(df[df["suite"] == name].reset_index(drop=True), null_draws=null_draws)
        r["suite"] = name
        results[name] = r
    if all(r["n_runs"] == 0 for r in results.values()):
        raise ValueError(f"all {len(df)} runs errored; first error: {df['error'].iloc[0]}")
    head, head_images, sb = headline(dirs, out, null_draws, plots) if suites else ("", [], {})
    for name, r in results.items():
        if name != LEGACY_SUITE:
            r["priors_why"] = ("priors are fitted and checked on the zoo; this suite's held-out scores are the "
                               "headline's")
        elif priors:
            # the zoo's held-out prior scores; the side-by-side section already computed them
            if sb.get("priors") is not None or len(names) == 1:
                r["priors_md"], r["priors_why"] = priors_section(out, sb.get("priors"))
            else:  # evaluating the folder would pool the other suites' runs into the zoo's folds
                r["priors_md"], r["priors_why"] = None, "needs the side-by-side evaluation when suites share a folder"
    main_name = names[0]
    res = results[main_name]
    images = {n: (plot_all(r, out, arch_goal=GOAL_TOP1_ARCH, prefix="" if n == main_name else f"{n}_")
                  if plots and r["n_runs"] else []) for n, r in results.items()}

    def text(prefix: str = "") -> str:
        more = []
        for n in names[1:]:
            more.append(f"## {n.capitalize()} suite\n")
            more += (sections(results[n], images[n], prefix, level=3) if results[n]["n_runs"]
                     else [f"_all {results[n]['n_records']} runs errored_\n"])
        return render(res, out, images[main_name], prefix, headline=head.replace("{prefix}", prefix), more=more,
                      others=dirs[1:], code=code)

    path = out / "REPORT.md"
    path.write_text(text())
    (out / "summary.json").write_text(json.dumps(
        {"overall": json.loads(res["overall"].to_json(orient="index")),
         "goals": res["goals"].to_dict(orient="records"), "n_runs": res["n_runs"],
         "n_errors": res["n_errors"], "suite": main_name,
         "suites": json.loads(sb["table"].to_json()) if sb else {}}, indent=1))
    if publish:
        pub = Path(publish)
        img_dir = pub.with_suffix("")  # docs/benchmark.md -> docs/benchmark/
        img_dir.mkdir(parents=True, exist_ok=True)
        for i in head_images + [i for v in images.values() for i in v]:
            shutil.copy(out / i, img_dir / i)
        publish_markdown(pub, text(f"{img_dir.name}/"))
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
    p.add_argument("dir", nargs="+", help="benchmark output folder(s) (records.csv or records.parquet); the "
                   "report is written into the first. Suites are told apart by the records' suite column")
    p.add_argument("--publish", metavar="MD", help="also write this markdown copy (images in a folder beside it)")
    p.add_argument("--null-draws", type=int, default=2000, help="draws of the ECE null band (default %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--no-priors", action="store_true",
                   help="skip the prior-tuning section (k-fold and leave-one-architecture-out refits)")
    p.add_argument("--no-suites", action="store_true",
                   help="skip the suites side-by-side headline (it refits priors like the prior-tuning section)")


def main(args: argparse.Namespace) -> int:
    """Write the report for parsed ``args``."""
    dirs = [args.dir] if isinstance(args.dir, str) else list(args.dir)
    path = write_report(dirs, publish=args.publish, null_draws=args.null_draws, plots=not args.no_plots,
                        priors=not args.no_priors, suites=not getattr(args, "no_suites", False))
    summ = json.loads((Path(dirs[0]) / "summary.json").read_text())
    print(f"wrote {path}")
    for g in summ["goals"]:
        print(f"  {g['verdict']:4}  {g['goal']}: {g['measured']}")
    return 0
