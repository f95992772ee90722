"""The benchmark's records: one row per run, their columns, and how they are stored.

Every run leaves ``DIR/records/<key>.json`` (strict JSON: NaN and infinities spelled
``"nan"``/``"inf"``/``"-inf"``, see :mod:`neuraldbg.jsonio`); :func:`collect` gathers them into
``DIR/records.csv`` (+ ``records.parquet`` when a parquet engine is installed) and
:func:`load_records` reads them back. The columns are a public contract (``docs/api.md``,
``docs/benchmark.md``): columns may be added, never renamed or dropped.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from benchmarks import baselines
from benchmarks.metrics import post_column, posterior_columns
from neuraldbg.causal.hypotheses import REPORT_FLOOR
from neuraldbg.jsonio import decode_float, encode_nonfinite, write_json_atomic
from neuraldbg.vocab import ALL_EVENT_KINDS, ROOTS

log = logging.getLogger("neuraldbg")

#: The columns docs/api.md fixes, in its order.
API_COLUMNS: tuple[str, ...] = (
    "arch", "family", "injection", "seed", "true_cause", "true_state", "pred_cause", "pred_state",
    "pred_prob", "p_healthy", "origin_layer", "true_layer", "onset_step", "true_onset", "steps",
    "seconds", "seconds_bare",
) + tuple(posterior_columns())
#: Further columns every record carries (new ones last: earlier columns keep their positions);
#: ``code`` is the hash of the code that made the record (:func:`neuraldbg.source.code_version`);
#: ``note`` says what ran otherwise than written, and why (``RunResult.notes``: an LSTM in float32
#: on a CPU without bf16 LSTM kernels), empty when everything ran as written; ``pred_evidence``
#: names the observations that favour the top hypothesis (likelihood ratio against a healthy run
#: at least ``neuraldbg.causal.hypotheses.SUPPORT_LR``, strongest first), empty when it rests on
#: none of its own; ``every`` is the monitor's check interval the run asked for (``auto``, its
#: default, or an interval: ``run --every``).
EXTRA_COLUMNS: tuple[str, ...] = (
    "key", "n_hypotheses", "hypotheses", "posterior", "n_events", *(f"events_{k}" for k in ALL_EVENT_KINDS),
    "first_event_kind", "first_event_layer", "first_event_step", "loss_first", "loss_last",
    "loss_nonfinite", "baseline_first_event", "baseline_threshold_rules", "rules_fired",
    "timing_order", "steps_requested", "session", "harness_seconds", "error", "suite", "code", "note",
    "pred_evidence", "every",
)
RECORD_COLUMNS: tuple[str, ...] = API_COLUMNS + EXTRA_COLUMNS
#: Columns of ``run --verify`` (docs/verification.md): the top hypothesis and posterior after
#: verification, what it cost, and every test with its outcome; empty without ``--verify``.
VERIFY_COLUMNS: tuple[str, ...] = (
    "verified_pred_cause", "verified_pred_state", "verified_pred_prob", "verified_p_healthy",
    *(f"verified_{c}" for c in posterior_columns()), "verify_extra_steps", "verify_seconds",
    "verify_tests", "verify_joint_before", "snapshot_bytes", "verify_error",
)
#: Columns holding text, even when every value looks like a number (``nn.Sequential`` layers
#: are called "0", "1", ...) or like a non-finite float (event kinds ``nan`` and ``inf``).
TEXT_COLUMNS: tuple[str, ...] = (
    "arch", "family", "injection", "true_cause", "true_state", "pred_cause", "pred_state", "origin_layer",
    "true_layer", "key", "hypotheses", "posterior", "first_event_kind", "first_event_layer",
    "baseline_first_event", "baseline_threshold_rules", "rules_fired", "timing_order", "session", "error",
    "traceback", "suite", "code", "note", "pred_evidence", "every", "verified_pred_cause", "verified_pred_state",
    "verify_tests", "verify_joint_before", "verify_error",
)
#: Columns holding whole numbers (possibly missing).
INT_COLUMNS: tuple[str, ...] = (
    "seed", "onset_step", "true_onset", "steps", "n_hypotheses", "n_events",
    *(f"events_{k}" for k in ALL_EVENT_KINDS), "first_event_step", "loss_nonfinite", "steps_requested",
    "verify_extra_steps", "snapshot_bytes",
)
#: The suite of records written before the ``suite`` column existed: they all came from the zoo.
LEGACY_SUITE = "zoo"


# --------------------------------------------------------------------------- building a record

def empty_record(key: str, suite: str, arch: str, injection: str, seed: int,
                 steps: int | None) -> dict[str, Any]:
    """A record with every column present (``None``) and the run's identity filled in."""
    rec: dict[str, Any] = {c: None for c in RECORD_COLUMNS}
    rec.update(arch=arch, injection=injection, seed=seed, key=key, steps_requested=steps, suite=suite)
    return rec


def fill_truth(rec: dict[str, Any], inj: Any) -> None:
    """The ground-truth columns from an injection (``name``/``truth``/``onset``/``layer``)."""
    truth = getattr(inj, "truth", None)
    rec["true_cause"], rec["true_state"] = (truth if truth else ("", ""))
    rec["true_layer"] = getattr(inj, "layer", None) or ""
    rec["true_onset"] = getattr(inj, "onset", None)


def fill_run(rec: dict[str, Any], res: Any) -> None:
    """Columns from a monitored run's result: actual onset/layer, time, steps, loss summary."""
    # the suite reports where and when the fault actually took effect (a one-shot batch
    # fault fires on the first batch at/after the nominal onset); prefer that
    if getattr(res, "onset", None) is not None:
        rec["true_onset"] = int(res.onset)
    if getattr(res, "layer", None):
        rec["true_layer"] = res.layer
    rec["seconds"] = float(res.wall_time)
    rec["steps"] = int(res.steps)
    rec["note"] = "; ".join(getattr(res, "notes", ()) or ())
    losses = list(getattr(res, "losses", []) or [])
    if losses:
        rec["loss_first"] = _finite_or_none(losses[0])
        rec["loss_last"] = _finite_or_none(losses[-1])
        rec["loss_nonfinite"] = int(sum(1 for v in losses if not math.isfinite(float(v))))


def fill_monitor(rec: dict[str, Any], dbg: Any, session_path: Path, out: Path) -> None:
    """Fill the posterior, hypothesis, event and baseline columns from a finished monitor."""
    post = dbg.posterior()
    p_h = getattr(post, "p_healthy", None)
    if p_h is None:
        p_h = post.get("healthy", {}).get("yes")
    rec["p_healthy"] = float(p_h)
    for var, states in ROOTS.items():
        for s in states:
            rec[post_column(var, s)] = float(post.get(var, {}).get(s, float("nan")))
    # extra states/variables a developer added get their own columns too
    for var, dist in post.items():
        if var == "healthy" or not isinstance(dist, Mapping):
            continue
        for s, p in dist.items():
            rec.setdefault(post_column(var, s), float(p))
    rec["posterior"] = json.dumps({v: {s: float(p) for s, p in d.items()} for v, d in post.items()
                                   if isinstance(d, Mapping)})

    hyps = list(dbg.get_causal_hypotheses())
    rec["n_hypotheses"] = len(hyps)
    rec["hypotheses"] = json.dumps([_hyp_dict(h) for h in hyps])
    if hyps:
        top = hyps[0]
        rec.update(pred_cause=top.cause, pred_state=top.state, pred_prob=float(top.probability),
                   origin_layer=getattr(top, "origin_layer", None) or "",
                   onset_step=getattr(top, "onset_step", None), pred_evidence=own_evidence(dbg, top))
    else:
        rec.update(pred_cause="", pred_state="", pred_prob=None, origin_layer="", onset_step=None, pred_evidence="")

    events = list(dbg.events)
    rec["n_events"] = len(events)
    for k in ALL_EVENT_KINDS:
        rec[f"events_{k}"] = sum(1 for e in events if getattr(e, "kind", None) == k)
    if events:
        first = min(events, key=lambda e: e.step)  # stable: ties keep the monitor's order
        rec.update(first_event_kind=first.kind, first_event_layer=first.layer or "", first_event_step=first.step)

    session_path.parent.mkdir(parents=True, exist_ok=True)
    dbg.export_aquarium_package(str(session_path))
    rec["session"] = str(session_path.relative_to(out))
    # baselines read the exported file: exactly the trace a user (or a refit) would have
    with open(session_path) as f:
        session = json.load(f)
    trace = baselines.view(session)
    if trace.loss_first is None and rec["loss_first"] is not None:
        trace = baselines.TraceView(trace.events, rec["loss_first"], rec["loss_last"],
                                    int(rec["loss_nonfinite"] or 0))
    rec["baseline_first_event"] = json.dumps(baselines.first_event(trace))
    rec["baseline_threshold_rules"] = json.dumps(baselines.threshold_rules(trace))
    rec["rules_fired"] = json.dumps(baselines.fired_rules(trace))


def fill_verification(rec: dict[str, Any], dbg: Any, res: Any, steps: int, top: int) -> None:
    """The ``verified_*`` columns: ``dbg.verify(res.replay, steps, top)``. A suite without a
    replay, or a verification that raises, leaves them empty and says why in ``verify_error``."""
    rec["snapshot_bytes"] = int(getattr(dbg, "snapshot_bytes", 0) or 0)
    replay = getattr(res, "replay", None)
    if replay is None:
        rec["verify_error"] = "this suite's runs expose no replay function"
        return
    t0 = time.perf_counter()
    try:
        v = dbg.verify(replay, steps=steps, top=top)
    except Exception as exc:  # one failed verification must not lose the run's record
        rec["verify_error"] = f"{type(exc).__name__}: {exc}"
        log.warning("verification of %s failed: %s", rec.get("key"), rec["verify_error"])
        return
    rec["verify_seconds"] = time.perf_counter() - t0
    rec["verify_extra_steps"] = int(v.extra_steps)
    rec["verified_p_healthy"] = float(v.posterior.p_healthy)
    for var, states in ROOTS.items():
        for s in states:
            rec["verified_" + post_column(var, s)] = float(v.posterior[var][s])
    top_h = v.hypotheses[0] if v.hypotheses and v.hypotheses[0].probability >= REPORT_FLOOR else None
    rec.update(verified_pred_cause=top_h.cause if top_h else "", verified_pred_state=top_h.state if top_h else "",
               verified_pred_prob=float(top_h.probability) if top_h else None)
    rec["verify_tests"] = json.dumps([t.to_dict() for t in v.tests])
    rec["verify_joint_before"] = json.dumps(list(v.root_joint_before))
    rec["verify_error"] = ""


def own_evidence(dbg: Any, h: Any) -> str:
    """The observations that favour hypothesis ``h`` of the monitor ``dbg``, strongest first
    (comma-separated; empty when none does: a hypothesis resting on no evidence of its own)."""
    from neuraldbg.causal import api
    from neuraldbg.causal.hypotheses import support

    try:
        # the trace the monitor's queries answer for: the whole job's once merged, else this rank's
        tr = getattr(dbg, "merged_trace", None) or dbg.trace()
        sup = support(api.compiled(api.resolve_priors(tr, getattr(dbg, "priors", None))), api.evidence(tr),
                      h.cause, h.state)
    except Exception as exc:  # noqa: BLE001 - a record keeps its other columns
        log.warning("own evidence of %s/%s not computed: %r", h.cause, h.state, exc)
        return ""
    return ",".join(v for v, _ in sorted(sup.items(), key=lambda kv: (-kv[1], kv[0])))


def _hyp_dict(h: Any) -> dict[str, Any]:
    ev = getattr(h, "evidence", None) or ()
    return {
        "cause": h.cause, "state": h.state, "probability": float(h.probability),
        "failure_type": getattr(h, "failure_type", None), "origin_layer": getattr(h, "origin_layer", None),
        "onset_step": getattr(h, "onset_step", None), "n_evidence": len(ev),
    }


def family_of(res: Any, dbg: Any, suite: Any, arch: str) -> str | None:
    """The run's family: the monitor's, else the result's, else ``suite.family(arch)``."""
    for src in (dbg, res):
        fam = getattr(src, "family", None)
        if isinstance(fam, str) and fam:
            return fam
    fn = getattr(suite, "family", None)
    return fn(arch) if callable(fn) else None


def _finite_or_none(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# --------------------------------------------------------------------------- one record file

def record_path(out: str | os.PathLike, key: str) -> Path:
    """Where the record of run ``key`` lives under the output folder ``out``."""
    return Path(out) / "records" / f"{key}.json"


def write_record(out: str | os.PathLike, rec: Mapping[str, Any]) -> Path:
    """Write ``rec`` to ``out/records/<key>.json`` atomically (a killed run leaves no torn file)."""
    # numpy scalars and other oddities become strings, as the records always spelled them
    plain = json.loads(json.dumps(dict(rec), default=str))
    path = record_path(out, str(rec["key"]))
    write_json_atomic(path, encode_nonfinite(plain), indent=None)
    return path


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """One record file as a dict, non-finite numbers restored (``OSError``/``ValueError`` if unreadable)."""
    rec = json.loads(Path(path).read_text())
    if not isinstance(rec, dict):
        raise ValueError(f"{path}: a record is a JSON object, got {type(rec).__name__}")
    # text columns keep "nan"/"inf": they are event kinds there, not numbers
    return {k: (v if k in TEXT_COLUMNS else decode_float(v)) for k, v in rec.items()}


# --------------------------------------------------------------------------- the tables

def collect(out: str | os.PathLike) -> pd.DataFrame:
    """Gather ``out/records/*.json`` into one frame and write ``records.csv`` (+ ``.parquet``)."""
    out = Path(out)
    recs = []
    for path in sorted((out / "records").glob("*.json")):
        try:
            recs.append(read_record(path))
        except (OSError, ValueError) as exc:
            log.warning("skipping unreadable record %s: %s", path, exc)
    df = pd.DataFrame(recs)
    for c in RECORD_COLUMNS:
        if c not in df.columns:
            df[c] = None
    df["suite"] = df["suite"].where(df["suite"].notna(), LEGACY_SUITE)
    extra = sorted(c for c in df.columns if c not in RECORD_COLUMNS)
    df = df[list(RECORD_COLUMNS) + extra]
    for c in (c for c in INT_COLUMNS if c in df.columns):  # verify_* only after run --verify
        # nullable ints: "60" and an empty cell in the CSV, not "60.0" and "nan"
        df[c] = pd.to_numeric(df[c], errors="coerce").round().astype("Int64")
    if len(df):
        df = df.sort_values(["arch", "injection", "seed"], kind="stable").reset_index(drop=True)
    df.to_csv(out / "records.csv", index=False)
    try:
        import pyarrow  # noqa: F401

        _to_parquet(df, out / "records.parquet")
    except ImportError:
        pass
    return df


def _to_parquet(df: pd.DataFrame, path: Path) -> None:
    # object columns mix None, str and numbers across runs; parquet wants one type per column
    frame = df.copy()
    for c in frame.columns:
        if c in TEXT_COLUMNS:
            frame[c] = frame[c].map(_text_or_none)
        elif frame[c].dtype == object:
            num = pd.to_numeric(frame[c], errors="coerce")
            if num.notna().sum() == frame[c].notna().sum() and frame[c].notna().any():
                frame[c] = num
            else:
                frame[c] = frame[c].map(_text_or_none)
    frame.to_parquet(path, index=False)


def _text_or_none(v: Any) -> str | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def load_records(out: str | os.PathLike) -> pd.DataFrame:
    """Read ``out/records.parquet`` (or ``records.csv``); text columns stay text, missing cells are NA."""
    out = Path(out)
    if (out / "records.parquet").exists():
        try:
            return pd.read_parquet(out / "records.parquet")
        except Exception as exc:  # an unreadable parquet: the CSV holds the same rows
            log.warning("could not read %s (%s); using records.csv", out / "records.parquet", exc)
    if (out / "records.csv").exists():
        return pd.read_csv(out / "records.csv", keep_default_na=False, na_values=[""],
                           dtype={c: str for c in TEXT_COLUMNS})
    if (out / "records").is_dir():
        return collect(out)
    raise FileNotFoundError(f"no records in {out}: expected records.parquet, records.csv or records/")
