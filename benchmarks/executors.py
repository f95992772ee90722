"""Where the benchmark's runs execute: in this process, in a local process pool, or as Ray tasks.

``python -m benchmarks run --executor {pool,ray,inline}`` (docs/benchmark.md, "Executors").
An executor takes the runs still to do and yields ``(spec, record)`` for each finished run, in
the order they finish; :func:`benchmarks.harness.run_suite` plans, resumes, counts errors, shows
the progress bar and collects the table. Every executor leaves the same files in ``DIR``:
``records/<key>.json`` and ``sessions/<key>.json``.

* ``inline`` runs :func:`~benchmarks.harness.run_one` here, one run after the other (debugging;
  ``--workers 0``).
* ``pool`` (the default) runs it in a local process pool (forkserver, else spawn), one torch
  thread per worker; each worker writes its run's files into ``DIR`` itself.
* ``ray`` sends each run to a Ray task of one CPU, on a local Ray (``ray.init(num_cpus=N)``) or a
  cluster (``--address``). The task trains in a scratch folder of the node it lands on and returns
  the record and the exported session document (:func:`~benchmarks.harness.run_detached`); the
  driver writes both into ``DIR``, so only the driver needs to reach ``DIR``. The driver's
  ``neuraldbg``, ``benchmarks`` and ``models`` are shipped to the workers (Ray's ``py_modules``),
  so every node runs the driver's code, whatever is installed there.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Iterator, Sequence

from benchmarks.suites import RunSpec

log = logging.getLogger("neuraldbg")

__all__ = ["DEFAULT_EXECUTOR", "EXECUTORS", "Executor", "ExecutorError", "InlineExecutor", "PoolExecutor",
           "RayExecutor", "make_executor", "usable_cores"]

#: What ``pip`` must install for ``--executor ray`` (the ``bench-ray`` extra of pyproject.toml).
RAY_INSTALL = "pip install -e '.[bench-ray]'"
#: Times Ray runs a task again when its worker process dies (a node lost, the out-of-memory
#: killer); a run that raises is never retried: run_one records the error instead.
RAY_TASK_RETRIES = 2
#: Ray's setting of its task workers' niceness (Ray's default: 15).
NICENESS_ENV = "RAY_worker_niceness"


class ExecutorError(RuntimeError):
    """An executor cannot run here (Ray missing, no cluster at the address); the message says what to do."""


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


Result = Iterator[tuple[RunSpec, dict[str, Any]]]


class Executor:
    """Runs specs and yields ``(spec, record)`` as each finishes; the record files are written
    into ``out`` before it is yielded."""

    name = ""

    def results(self, todo: Sequence[RunSpec], out: Path) -> Result:
        raise NotImplementedError

    def describe(self) -> str:
        """How the runs are executed, for ``run_meta.json`` and the log."""
        return self.name


class InlineExecutor(Executor):
    """Every run in this process, one after the other."""

    name = "inline"

    def results(self, todo: Sequence[RunSpec], out: Path) -> Result:
        from benchmarks.harness import run_one

        for spec in todo:
            yield spec, run_one(spec, out)


class PoolExecutor(Executor):
    """A local process pool of ``workers`` processes with one torch thread each."""

    name = "pool"

    def __init__(self, workers: int):
        self.workers = workers

    def describe(self) -> str:
        return f"pool of {self.workers} processes"

    def results(self, todo: Sequence[RunSpec], out: Path) -> Result:
        from benchmarks.harness import failed_record, init_worker, run_one

        if not todo:
            return
        methods = mp.get_all_start_methods()
        ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
        env_before = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        # children read these at torch import, before init_worker runs
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            with ProcessPoolExecutor(max_workers=min(self.workers, len(todo)), mp_context=ctx,
                                     initializer=init_worker) as pool:
                pending = {pool.submit(run_one, spec, str(out)): spec for spec in todo}
                try:
                    while pending:
                        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            spec = pending.pop(fut)
                            try:
                                rec = fut.result()
                            except BrokenProcessPool:
                                raise
                            except Exception as exc:  # the worker itself died or could not pickle
                                rec = failed_record(out, spec, exc)
                            yield spec, rec
                except BaseException:
                    for fut in pending:
                        fut.cancel()
                    raise
        except BrokenProcessPool as exc:
            # a worker was killed (out of memory, segfault in a kernel): keep what finished
            log.error("benchmark: worker pool broke (%s); finished runs are kept, re-run to resume", exc)
        finally:
            for k, v in env_before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _ray_task(spec: RunSpec) -> tuple[dict[str, Any], str | None]:
    """Body of one Ray task: the run in a scratch folder, its record and session text returned."""
    from benchmarks.harness import init_worker, run_detached

    init_worker()
    return run_detached(spec)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


class RayExecutor(Executor):
    """Ray tasks of one CPU each: a local Ray of ``workers`` CPUs, or the cluster at ``address``.

    With an address, ``workers`` (when given) caps the runs in flight at once; without it every
    run is submitted and Ray schedules them on the cluster's CPUs. When this process is already
    connected to Ray (``ray.is_initialized()``) that connection is used and left open.
    """

    name = "ray"

    def __init__(self, workers: int | None, address: str | None):
        self.workers = workers
        self.address = address

    def describe(self) -> str:
        if self.address:
            cap = f", at most {self.workers} runs at once" if self.workers else ""
            return f"ray cluster at {self.address}{cap}"
        return f"local ray of {self.workers or usable_cores()} CPUs"

    def _connect(self, ray: Any) -> bool:
        """Start or join Ray; True when this call did (and so must shut it down)."""
        if ray.is_initialized():
            return False
        import benchmarks
        import models
        import neuraldbg

        # the driver's code travels with the tasks: a worker imports this checkout's packages,
        # not whatever version its node has installed (docs/benchmark.md, "Executors")
        runtime_env = {"py_modules": [neuraldbg, benchmarks, models], "excludes": ["__pycache__", "*.pyc"]}
        kwargs: dict[str, Any] = {"runtime_env": runtime_env, "logging_level": logging.WARNING,
                                  "include_dashboard": False}
        local = not self.address
        if local:
            # "local": a new Ray of its own, never a cluster that RAY_ADDRESS or an earlier
            # `ray start` on this machine points to (joining one takes --address)
            kwargs.update(address="local", num_cpus=self.workers or usable_cores())
        else:
            kwargs["address"] = self.address
        # Ray runs task workers at nice 15 unless told otherwise; the local Ray's tasks get the
        # priority the pool's processes have (on a machine shared with other work they would
        # otherwise wait behind it). A cluster's nodes decide at `ray start` (docs/benchmark.md).
        nice_set = local and NICENESS_ENV not in os.environ
        if nice_set:
            os.environ[NICENESS_ENV] = "0"
        try:
            ray.init(**kwargs)
        except ConnectionError as exc:
            raise ExecutorError(f"no Ray cluster at {self.address!r} ({exc}); start one with `ray start --head` "
                                "(and `ray start --address=HEAD:6379` on the other machines), pass "
                                "--address HEAD:6379 or auto, or leave --address out for a local Ray. A cluster "
                                "with token authentication also needs RAY_AUTH_MODE=token here (and RAY_AUTH_TOKEN, "
                                "from `ray get-auth-token` on the head, where ~/.ray/auth_token is missing)") from None
        finally:
            if nice_set:
                os.environ.pop(NICENESS_ENV, None)
        return True

    def results(self, todo: Sequence[RunSpec], out: Path) -> Result:
        from benchmarks.harness import failed_record, store_run

        if not todo:
            return
        ray = _import_ray()
        started = self._connect(ray)
        task = ray.remote(num_cpus=1, max_retries=RAY_TASK_RETRIES)(_ray_task)
        window = self.workers or len(todo)
        queue = iter(todo)
        pending: dict[Any, RunSpec] = {}

        def submit() -> None:
            spec = next(queue, None)
            if spec is not None:
                pending[task.remote(spec)] = spec

        try:
            for _ in range(window):
                submit()
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    spec = pending.pop(ref)
                    try:
                        rec, session = ray.get(ref)
                    except Exception as exc:  # the task's worker died past its retries, or a node was lost
                        rec = failed_record(out, spec, exc)
                    else:
                        store_run(out, rec, session)
                    submit()
                    yield spec, rec
        finally:
            for ref in pending:
                ray.cancel(ref)
            if started:
                ray.shutdown()


#: ``--executor`` values; the first is the default.
EXECUTORS: tuple[str, ...] = ("pool", "ray", "inline")
DEFAULT_EXECUTOR = EXECUTORS[0]


def make_executor(name: str = DEFAULT_EXECUTOR, workers: int | None = None, address: str | None = None) -> Executor:
    """The executor ``--executor name --workers N --address ADDR`` asks for.

    ``workers=None`` means the usable cores (pool, local Ray) or no cap (a Ray cluster);
    ``pool`` with ``workers=0`` is ``inline``. Bad combinations raise ``ValueError`` naming the
    valid values; ``ExecutorError`` when ``ray`` is asked for and not installed.
    """
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; valid: {', '.join(EXECUTORS)}")
    if workers is not None and workers < 0:
        raise ValueError(f"--workers must be >= 0, got {workers}")
    if address is not None and name != "ray":
        raise ValueError(f"--address is the Ray cluster to run on; it needs --executor ray, not {name!r}")
    if name == "inline" or (name == "pool" and workers == 0):
        if name == "inline" and workers:
            raise ValueError(f"--executor inline runs in this process; --workers {workers} needs --executor pool "
                             "or ray")
        return InlineExecutor()
    if name == "pool":
        return PoolExecutor(usable_cores() if workers is None else workers)
    if workers == 0:
        raise ValueError("--workers 0 runs in this process (--executor inline); with --executor ray give "
                         "--workers N >= 1 or leave it out")
    _import_ray()  # fail before planning or writing anything
    return RayExecutor(workers, address)
