"""Scores of ``run --verify``: top-1 before and after verification, what it cost, false alarms.

Nothing is replayed here. Each record keeps the observational posterior over the root joint
states (``verify_joint_before``) and every test's outcome (``verify_tests``), so the posterior
after verification is recomputed for any likelihood table (:mod:`neuraldbg.verify.likelihoods`):

* ``after``: the shipped tables (``neuraldbg/priors/verification.json``); when they were
  fitted to these very runs this is an in-sample figure;
* ``after_cv``: tables fitted (hand-set prior, same ``ess``) on the other folds only, the
  folds being the seeds modulo 5, so each run is scored by likelihoods that never saw it;
* ``after_loao``: fitted on every other architecture (leave-one-architecture-out).

False alarms follow the report's rule (a hypothesis above the reporting floor, or
P(healthy) < 0.5) on healthy runs; ``new_alarms`` counts healthy runs verification turned
into alarms.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from benchmarks import metrics as M
from neuraldbg.causal.hypotheses import REPORT_FLOOR
from neuraldbg.verify import likelihoods as L
from neuraldbg.verify import tune as F
from neuraldbg.verify.outcome import OUTCOMES
from neuraldbg.vocab import HEALTHY, LABELS

FOLDS = 5


def verified_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Finished runs that carry a verification."""
    if "verify_tests" not in df.columns:
        return df.iloc[0:0]
    ok = df["verify_tests"].map(lambda v: not M.is_missing(v) and str(v).startswith("["))
    if "error" in df.columns:
        ok &= df["error"].map(M.is_missing)
    return df[ok.to_numpy(dtype=bool)].reset_index(drop=True)


def _tests(v: Any) -> list[tuple[str, str]]:
    return [(f"{t['cause']}/{t['state']}", t["outcome"]) for t in json.loads(v)
            if t["outcome"] in OUTCOMES]


def _scores(joint: np.ndarray) -> np.ndarray:
    marg, p_ok = L.marginals(joint)
    return np.array([p_ok if lab == HEALTHY else marg[lab.split("/")[0]][lab.split("/")[1]] for lab in LABELS])


def after_scores(df: pd.DataFrame, table_of: Callable[[int], Mapping[str, Mapping[str, float]]]) -> np.ndarray:
    """``(n, labels)`` scores after verification, row ``i`` updated with ``table_of(i)``."""
    rows = []
    for i, (j, t) in enumerate(zip(df["verify_joint_before"], df["verify_tests"])):
        joint = np.asarray(json.loads(j), dtype=float)
        rows.append(_scores(L.update(joint / joint.sum(), _tests(t), table_of(i))))
    return np.array(rows).reshape(len(df), len(LABELS))


def _held_out(df: pd.DataFrame, groups: np.ndarray, hand_set: Mapping, ess: float) -> np.ndarray:
    cases = [F.cases_from_records([rec]) for rec in df.to_dict("records")]
    tables = {}
    for g in sorted(set(groups.tolist()), key=str):
        train = [c for cs, gg in zip(cases, groups) if gg != g for c in cs]
        tables[g] = F.fit_tables(train, hand_set, ess)[0]
    fams = df["family"].astype(str).tolist()

    def table_of(i: int) -> Mapping:
        t = tables[groups[i]]
        return t.get(fams[i]) or t["default"]
    return after_scores(df, table_of)


def _alarms(scores: np.ndarray) -> np.ndarray:
    return (scores[:, 1:].max(axis=1) >= REPORT_FLOOR) | (scores[:, 0] < 0.5)


def evaluate(df: pd.DataFrame, likelihoods: Any = None) -> dict[str, Any]:
    """Top-1 before/after per architecture and overall, extra steps, false alarms (module docstring)."""
    good = verified_runs(df)
    res: dict[str, Any] = {"n": int(len(good))}
    if not len(good):
        return res
    data = L.load(likelihoods)
    y = M.label_index(M.true_labels(good), LABELS)
    fams = good["family"].astype(str).tolist()
    variants = {"before": M.label_scores(good, LABELS).to_numpy(),
                "after": after_scores(good, lambda i: L.table_for(fams[i], data))}
    ess = float((data.get("provenance") or {}).get("ess", F.DEFAULT_ESS))
    seeds = pd.to_numeric(good["seed"], errors="coerce").fillna(0).astype(int).to_numpy()
    variants["after_cv"] = _held_out(good, seeds % FOLDS, data["hand_set"], ess)
    variants["after_loao"] = _held_out(good, good["arch"].astype(str).to_numpy(), data["hand_set"], ess)
    steps = pd.to_numeric(good["verify_extra_steps"], errors="coerce")
    hit = {k: M.topk_correct(s, y, 1) for k, s in variants.items()}
    arch = good["arch"].astype(str).to_numpy()
    rows = []
    for a in [*sorted(set(arch)), "overall"]:
        m = np.ones(len(arch), bool) if a == "overall" else arch == a
        rows.append({"arch": a, "n": int(m.sum()), **{f"top1_{k}": float(h[m].mean()) for k, h in hit.items()},
                     "extra_steps_median": float(steps[m].median())})
    res["per_arch"] = pd.DataFrame(rows).set_index("arch")
    healthy = (M.true_labels(good) == HEALTHY).to_numpy(dtype=bool)
    before_alarm = _alarms(variants["before"])[healthy]
    fa = {}
    for k, s in variants.items():
        al = _alarms(s)[healthy]
        fa[k] = {"alarms": int(al.sum()), "new_alarms": int((al & ~before_alarm).sum()),
                 "cleared": int((~al & before_alarm).sum())}
    res["false_alarms"] = pd.DataFrame(fa).T.rename_axis("scores")
    res["n_healthy"] = int(healthy.sum())
    res["extra_steps_median"] = float(steps.median())
    res["extra_steps_mean"] = float(steps.mean())
    sec = pd.to_numeric(good.get("verify_seconds"), errors="coerce")
    res["seconds_median"] = float(sec.median()) if sec is not None and sec.notna().any() else math.nan
    res["tables"] = (data.get("provenance") or {}).get("method", "hand-set")
    return res


def render(res: Mapping[str, Any], suite: str = "zoo") -> str:
    """The verification section of REPORT.md for one suite."""
    from benchmarks.evaluation import fmt

    if not res.get("n"):
        return ""
    pa = res["per_arch"]

    def table(df: pd.DataFrame) -> str:
        d = df.reset_index()
        lines = ["| " + " | ".join(map(str, d.columns)) + " |", "|" + "|".join(" --- " for _ in d.columns) + "|"]
        lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in d.itertuples(index=False)]
        return "\n".join(lines) + "\n"
    ov = pa.loc["overall"]
    return "\n".join([
        f"## Verification by replay ({suite})\n",
        f"{res['n']} runs verified (`run --verify`): top-1 {fmt(ov['top1_before'])} before, "
        f"{fmt(ov['top1_after'])} after with the shipped likelihoods ({res['tables']}), "
        f"{fmt(ov['top1_after_cv'])} with likelihoods fitted on the other seeds' folds and "
        f"{fmt(ov['top1_after_loao'])} leave-one-architecture-out; median {fmt(res['extra_steps_median'], 0)} "
        f"extra steps per run (mean {fmt(res['extra_steps_mean'], 1)}), median "
        f"{fmt(res['seconds_median'], 2)} s. docs/verification.md has the method.\n",
        table(pa),
        f"Healthy runs ({res['n_healthy']}): alarms before and after, `new_alarms` turned into alarms by "
        "verification, `cleared` alarms it removed.\n",
        table(res["false_alarms"]),
    ])
