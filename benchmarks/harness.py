"""The benchmark harness: run a suite with injected failures and record what NeuralDBG concluded.

``python -m benchmarks run [--suite zoo|ecosystem] [--quick] [--arch NAME ...] [--injection NAME ...]
[--seeds N] [--executor pool|ray|inline] [--address ADDR] [--workers N] [--verify [--verify-steps N]
[--verify-top K]] [--out DIR]``

Every run is one ``(architecture, injection, seed)`` of a suite (:mod:`benchmarks.suites`:
the zoo by default, ``--suite ecosystem`` for the ecosystem models).

A worker (one torch thread: a process of a local pool by default, a Ray task with
``--executor ray``, see :mod:`benchmarks.executors`) trains a run with the monitor on, asks the causal engine
for its posterior and hypotheses, exports the session to ``DIR/sessions/<key>.json`` (so
priors can be refitted without retraining), scores the rule baselines on that same exported
trace, and trains the same run again without the monitor for ``seconds_bare`` (healthy runs of
seeds below ``--bare-seeds``; injected ones too with ``--bare-injected``). The two trainings of
a pair run back to back in one process, in an order that alternates with a hash of the run's
key, so warm-up effects (first-call allocations, ``torch.compile`` caches) cancel in the
per-architecture median of ``seconds / seconds_bare``.

With ``--verify`` the monitored run keeps snapshots and, once scored, verifies its leading
hypotheses by replay (``dbg.verify(result.replay, ...)``, docs/verification.md); the record
gains the ``verified_*`` / ``verify_*`` columns (:data:`benchmarks.records.VERIFY_COLUMNS`).

Each finished run leaves ``DIR/records/<key>.json`` at once (:mod:`benchmarks.records`);
re-running with the same ``--out`` skips those (errored runs are retried), and
``DIR/records.csv`` (+ ``.parquet`` with pyarrow) is rebuilt from every record in the folder
at the end. A run that raises is recorded with an ``error`` column instead of stopping the
suite. Keys are ``<arch>__<injection>__<seed>`` for the zoo and
``<suite>__<arch>__<injection>__<seed>`` for other suites, so suites can share a folder.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from benchmarks import log_to_stderr
from benchmarks.executors import DEFAULT_EXECUTOR, EXECUTORS, Executor, make_executor, usable_cores
from benchmarks.records import (API_COLUMNS, RECORD_COLUMNS, collect, empty_record, family_of, fill_monitor, fill_run,
                                fill_truth, fill_verification, load_records, read_record, record_path, write_record)
from benchmarks.suites import (DEFAULT_BARE_SEEDS, DEFAULT_SEEDS, DEFAULT_SUITE, HEALTHY_PER_SEED, QUICK_BARE_SEEDS,
                               QUICK_HEALTHY_SEEDS, QUICK_SEEDS, SUITES, RunSpec, get_suite, plan, suite_plan)
from neuraldbg.jsonio import write_json_atomic, write_text_atomic
from neuraldbg.source import code_version

log = logging.getLogger("neuraldbg")

__all__ = [
    "API_COLUMNS", "DEFAULT_SUITE", "RECORD_COLUMNS", "SUITES", "RunSpec", "collect", "get_suite",
    "load_records", "main", "plan", "run_detached", "run_one", "run_suite", "store_run", "suite_plan",
]


# --------------------------------------------------------------------------- one run

def _find_injection(zoo: Any, arch: str, name: str) -> Any:
    for inj in zoo.injections(arch):
        if inj.name == name:
            return inj
    raise ValueError(f"architecture {arch!r} has no injection {name!r}; "
                     f"valid: {', '.join(i.name for i in zoo.injections(arch))}")


def _empty_record(spec: RunSpec) -> dict[str, Any]:
    rec = empty_record(spec.key, spec.suite, spec.arch, spec.injection, spec.seed, spec.steps)
    rec["code"] = code_version()  # which code made it: a resume runs other code's records again
    rec["every"] = spec.every  # the cadence asked for: a resume at another one runs it again
    return rec


def _fresh_compile_state() -> None:
    """Forget earlier runs' ``torch.compile`` graphs.

    A worker trains many runs; dynamo guards on each new model and, past its cache-size
    limit, silently falls back to eager. Resetting before every training keeps each run
    compiled, and the monitored and bare twins pay the same compile cost.
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


#: Architectures this process has already trained (see :func:`_warm_up`).
_WARM: set[str] = set()
#: Length of the warm-up run.
WARMUP_STEPS = 3


def _warm_up(zoo: Any, arch: str, seed: int) -> None:
    """Train ``arch`` for a few monitored steps once per process before its first timed pair.

    The first run of an architecture in a process pays one-off costs (inductor start-up and
    code cache for ``torch.compile``, lazy imports, allocator growth) that would land on
    whichever twin runs first; with few pairs per architecture the alternating order cannot
    average them out.
    """
    if arch in _WARM:
        return
    _WARM.add(arch)
    try:
        _fresh_compile_state()
        zoo.run(arch, "healthy", seed, steps=WARMUP_STEPS, monitor=True)
    except Exception as exc:  # a warm-up failure only costs timing accuracy
        log.info("warm-up of %s failed (%s); timing its first pair cold", arch, exc)


def run_one(spec: RunSpec, out: str | os.PathLike, zoo: Any = None) -> dict[str, Any]:
    """Train one run with and without the monitor, score it, write its record and session.

    ``zoo`` is the suite object (default: the one ``spec.suite`` names). Never raises for a
    failing run: the exception is recorded in ``error``.
    """
    rec = _run_pair(spec, Path(out), zoo)
    write_record(out, rec)
    return rec


def run_detached(spec: RunSpec) -> tuple[dict[str, Any], str | None]:
    """:func:`run_one` in a scratch folder: the record and the exported session's text (``None``
    when the run failed before exporting it), for a driver to write with :func:`store_run`.

    What a Ray task runs (:mod:`benchmarks.executors`): the worker needs no access to ``DIR``.
    """
    with tempfile.TemporaryDirectory(prefix="neuraldbg-bench-") as tmp:
        rec = _run_pair(spec, Path(tmp), None)
        path = Path(tmp) / rec["session"] if rec.get("session") else None
        session = path.read_text() if path is not None and path.is_file() else None
    return rec, session


def store_run(out: str | os.PathLike, rec: dict[str, Any], session: str | None) -> None:
    """Write a detached run's session (at the record's ``session`` path under ``out``) and record,
    the files :func:`run_one` leaves."""
    if session is not None and rec.get("session"):
        write_text_atomic(Path(out) / rec["session"], session)
    write_record(out, rec)


def failed_record(out: str | os.PathLike, spec: RunSpec, exc: BaseException) -> dict[str, Any]:
    """Record (and write) a run whose worker died before returning a record of its own."""
    rec = _empty_record(spec)
    rec["error"] = f"{type(exc).__name__}: {exc}"
    log.warning("benchmark run %s failed: %s", spec.key, rec["error"])
    write_record(out, rec)
    return rec


def monitor_arguments(spec: RunSpec) -> dict[str, Any] | bool:
    """The ``NeuralDbg`` arguments of ``spec``'s monitored run: snapshots with ``--verify``, the
    check interval with ``--every`` (``True``: the monitor's defaults)."""
    kwargs: dict[str, Any] = {}
    if spec.verify_steps:
        kwargs["snapshots"] = True
    if spec.every != "auto":
        kwargs["every"] = int(spec.every)
    return kwargs or True


def _run_pair(spec: RunSpec, out: Path, zoo: Any) -> dict[str, Any]:
    """The body of :func:`run_one`: the record, with the session exported under ``out``."""
    t_start = time.perf_counter()
    rec = _empty_record(spec)
    try:
        zoo = zoo or get_suite(spec.suite)
        fill_truth(rec, _find_injection(zoo, spec.arch, spec.injection))

        # one-off costs go to a warm-up run; what is left (cache state, allocator) is spread by
        # alternating the pair's order with a stable hash of the key, which also alternates
        # across injections and architectures when only a few seeds are timed
        bare_first = spec.time_bare and zlib.crc32(spec.key.encode()) % 2 == 0
        if spec.time_bare:
            _warm_up(zoo, spec.arch, spec.seed)
        rec["timing_order"] = ("bare_first" if bare_first else "monitored_first") if spec.time_bare else "none"
        if bare_first:
            _fresh_compile_state()
            rec["seconds_bare"] = float(zoo.run(spec.arch, spec.injection, spec.seed, steps=spec.steps,
                                                monitor=None).wall_time)
        _fresh_compile_state()
        # --verify: the monitored run keeps snapshots (its ``seconds`` then include them)
        monitor = monitor_arguments(spec)
        res = zoo.run(spec.arch, spec.injection, spec.seed, steps=spec.steps, monitor=monitor)
        if spec.time_bare and not bare_first:
            _fresh_compile_state()
            rec["seconds_bare"] = float(zoo.run(spec.arch, spec.injection, spec.seed, steps=spec.steps,
                                                monitor=None).wall_time)
        fill_run(rec, res)
        dbg = res.dbg
        if dbg is None:
            raise RuntimeError(f"{SUITES[spec.suite]}.run(..., monitor=True) returned no dbg")
        rec["family"] = family_of(res, dbg, zoo, spec.arch)
        fill_monitor(rec, dbg, out / "sessions" / f"{spec.key}.json", out)
        if spec.verify_steps:
            fill_verification(rec, dbg, res, spec.verify_steps, spec.verify_top)
    except Exception as exc:  # one broken run must not stop the suite
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc(limit=-8)
        log.warning("benchmark run %s failed: %s", spec.key, rec["error"])
        log.debug("%s", rec["traceback"])
    rec["harness_seconds"] = time.perf_counter() - t_start
    rec["error"] = rec["error"] or ""
    return rec


# --------------------------------------------------------------------------- the suite

def init_worker() -> None:
    """One torch thread per worker: the pool (or Ray), not intra-op threads, uses the cores."""
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    log_to_stderr(logging.WARNING, "%(processName)s %(levelname)s %(message)s")


def _done_keys(out: Path, specs: Sequence[RunSpec], retry_errors: bool, keep_stale: bool = False) -> set[str]:
    done = set()
    stale = 0
    code = code_version()
    for spec in specs:
        path = record_path(out, spec.key)
        if not path.exists():
            continue
        try:
            rec = read_record(path)
        except (OSError, ValueError):
            continue  # a torn file from a killed run: redo it
        if rec.get("steps_requested") != spec.steps or str(rec.get("every") or "auto") != spec.every:
            continue
        if retry_errors and rec.get("error"):
            continue
        if spec.verify_steps and rec.get("verified_p_healthy") is None and not rec.get("verify_error"):
            continue  # recorded without --verify: run again with it
        if rec.get("code") != code and not keep_stale:
            stale += 1  # made by other code (or before records said which): its events may differ now
            continue
        done.add(spec.key)
    if stale:
        log.warning("benchmark: %d record(s) in %s were made by other code than this checkout's (%s): running "
                    "them again (--keep-stale keeps them)", stale, out, code)
    return done


def run_suite(specs: Sequence[RunSpec], out: str | os.PathLike, workers: int | None = None,
              retry_errors: bool = True, progress: bool = True, executor: str | Executor = DEFAULT_EXECUTOR,
              address: str | None = None, keep_stale: bool = False) -> pd.DataFrame:
    """Run every spec not already recorded in ``out`` and return all records of ``out``.

    ``executor`` (:mod:`benchmarks.executors`): ``"pool"``, a local process pool (forkserver
    where available, else spawn) of ``workers`` processes (default: the usable cores; ``0``
    runs in this process) with one torch thread each; ``"ray"``, Ray tasks of one CPU on a local
    Ray or the cluster at ``address``; ``"inline"``, this process. Every one leaves the same
    records and sessions. A record made by other code than this checkout's (its ``code``,
    :func:`neuraldbg.source.code_version`) is run again unless ``keep_stale``.
    """
    out = Path(out)
    if not isinstance(executor, Executor):
        executor = make_executor(executor, workers, address)
    (out / "records").mkdir(parents=True, exist_ok=True)
    done = _done_keys(out, specs, retry_errors, keep_stale)
    todo = [s for s in specs if s.key not in done]
    log.info("benchmark: %d runs planned, %d already recorded, %d to run (%s)", len(specs), len(done), len(todo),
             executor.describe())
    bar = _bar(len(todo), progress)
    n_err = 0
    try:
        for spec, rec in executor.results(todo, out):
            n_err += bool(rec["error"])
            bar.set_postfix(errors=n_err, last=spec.key, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        df = collect(out)
    if n_err:
        log.warning("benchmark: %d of %d runs failed; see the 'error' column of %s", n_err, len(todo),
                    out / "records.csv")
    return df


def _bar(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="benchmark", unit="run", disable=not enabled, dynamic_ncols=True,
                smoothing=0.1)


# --------------------------------------------------------------------------- command line

def _note_command(out: Path, planned: int, executor: Executor) -> None:
    """Append this invocation to ``out/run_meta.json`` (the report quotes the first one)."""
    path = out / "run_meta.json"
    try:
        meta = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        meta = {}
    cmd = "python -m benchmarks " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["run"] else "python -m benchmarks run"
    meta.setdefault("command", cmd)
    meta.setdefault("history", []).append({"command": cmd, "planned": planned, "executor": executor.describe(),
                                           "date": time.strftime("%Y-%m-%d %H:%M:%S")})
    meta["host"] = f"{platform.node()} ({usable_cores()} usable cores)"
    write_json_atomic(path, meta)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks run``."""
    p.add_argument("--suite", default=DEFAULT_SUITE, metavar="NAME",
                   help=f"what to run: {' or '.join(SUITES)} (default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help=f"small suite: {QUICK_SEEDS} seed per injection, {QUICK_HEALTHY_SEEDS} healthy runs "
                        f"per architecture")
    p.add_argument("--arch", nargs="+", metavar="NAME", help="architectures to run (default: all)")
    p.add_argument("--injection", nargs="+", metavar="NAME",
                   help="injections to run, 'healthy' included (default: all)")
    p.add_argument("--seeds", type=int, metavar="N", help=f"seeds per injection (default {DEFAULT_SEEDS})")
    p.add_argument("--healthy-seeds", type=int, metavar="N",
                   help=f"healthy runs per architecture (default {HEALTHY_PER_SEED} x seeds; "
                        f"quick {QUICK_HEALTHY_SEEDS})")
    p.add_argument("--steps", type=int, metavar="N", help="training steps per run (default: the suite's)")
    p.add_argument("--bare-seeds", type=int, metavar="K",
                   help=f"train the unmonitored timing twin for healthy runs of seeds < K "
                        f"(default {DEFAULT_BARE_SEEDS}, quick {QUICK_BARE_SEEDS}; -1: every seed)")
    p.add_argument("--bare-injected", action="store_true", help="also time injected runs without the monitor")
    p.add_argument("--executor", default=DEFAULT_EXECUTOR, choices=EXECUTORS,
                   help="where runs execute: a local process pool, Ray tasks (pip install -e '.[bench-ray]'), "
                        "or this process (default: %(default)s)")
    p.add_argument("--address", metavar="ADDR",
                   help="with --executor ray: the Ray cluster to join (HEAD:6379, or auto); default: start a "
                        "local Ray")
    p.add_argument("--workers", type=int, metavar="N",
                   help="pool processes or local Ray CPUs (default: usable cores; 0 = in-process); on a Ray "
                        "cluster, the most runs at once (default: no cap)")
    p.add_argument("--verify", action="store_true",
                   help="also verify each run's leading hypotheses by replay (docs/verification.md)")
    p.add_argument("--verify-steps", type=int, default=20, metavar="N",
                   help="replayed steps per hypothesis with --verify (default %(default)s)")
    p.add_argument("--verify-top", type=int, default=3, metavar="K",
                   help="hypotheses tested per run with --verify (default %(default)s)")
    p.add_argument("--every", default="auto", type=check_every_arg, metavar="N",
                   help="the monitor's check interval: auto (its default: a cadence that holds its overhead "
                        "budget) or a positive integer (1: every step)")
    p.add_argument("--out", default="bench-out/run", metavar="DIR", help="output folder (default: %(default)s)")
    p.add_argument("--no-retry-errors", action="store_true", help="on resume, keep errored records")
    p.add_argument("--keep-stale", action="store_true",
                   help="on resume, keep records made by other code than this checkout's (column 'code'); "
                        "by default they run again")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _plan_from_args(args: argparse.Namespace) -> list[RunSpec]:
    """The run list ``args`` ask for: the suite's own list when it has one and no seed counts
    were given, else every (architecture, injection) with the seed counts."""
    name = getattr(args, "suite", DEFAULT_SUITE)
    suite = get_suite(name)
    # a suite may time fewer twins than the zoo (``BARE_SEEDS = (full, quick)``): its budget
    default_bare = getattr(suite, "BARE_SEEDS", (DEFAULT_BARE_SEEDS, QUICK_BARE_SEEDS))
    bare = args.bare_seeds if args.bare_seeds is not None else default_bare[1 if args.quick else 0]
    bare_seeds = None if bare < 0 else bare
    if callable(getattr(suite, "suite_runs", None)) and args.seeds is None and args.healthy_seeds is None:
        return suite_plan(suite, args.quick, archs=args.arch, injections=args.injection, steps=args.steps,
                          bare_seeds=bare_seeds, bare_injected=args.bare_injected, suite=name)
    seeds = args.seeds if args.seeds is not None else (QUICK_SEEDS if args.quick else DEFAULT_SEEDS)
    healthy = args.healthy_seeds if args.healthy_seeds is not None else (QUICK_HEALTHY_SEEDS if args.quick else None)
    return plan(suite, archs=args.arch, injections=args.injection, seeds=seeds, healthy_seeds=healthy,
                steps=args.steps, bare_seeds=bare_seeds, bare_injected=args.bare_injected, suite=name)


def check_every_arg(value: str) -> str:
    """``--every``: ``"auto"`` or a positive integer, as text (``argparse`` names the option on error)."""
    if value == "auto" or (value.isdigit() and int(value) >= 1):
        return value if value == "auto" else str(int(value))
    raise argparse.ArgumentTypeError(f"expected auto or a positive integer, got {value!r}")


def _with_verify(specs: list[RunSpec], args: argparse.Namespace) -> list[RunSpec]:
    """``--verify``: every run also verifies its hypotheses (``ValueError`` for bad budgets)."""
    if not getattr(args, "verify", False):
        return specs
    for name in ("verify_steps", "verify_top"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return [dataclasses.replace(s, verify_steps=args.verify_steps, verify_top=args.verify_top) for s in specs]


def main(args: argparse.Namespace) -> int:
    """Run the suite described by parsed ``args``; the exit code is 1 when every run failed."""
    # a bad --executor/--address/--workers, or Ray missing, stops here, before anything is written
    executor = make_executor(getattr(args, "executor", DEFAULT_EXECUTOR), args.workers, getattr(args, "address", None))
    every = getattr(args, "every", "auto")
    specs = [dataclasses.replace(s, every=every) for s in _with_verify(_plan_from_args(args), args)]
    t0 = time.perf_counter()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    _note_command(Path(args.out), len(specs), executor)
    df = run_suite(specs, args.out, retry_errors=not args.no_retry_errors, progress=not args.no_progress,
                   executor=executor, keep_stale=getattr(args, "keep_stale", False))
    keys = {s.key for s in specs}
    mine = df[df["key"].isin(keys)]
    n_err = int((mine["error"].fillna("") != "").sum())
    print(f"{len(mine)} runs recorded in {args.out} ({n_err} errors), {time.perf_counter() - t0:.0f} s; "
          f"next: python -m benchmarks report {args.out}")
    return 1 if len(mine) and n_err == len(mine) else 0
