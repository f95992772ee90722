"""Step-time overhead of the monitor: alternating blocks of steps, side by side in one process.

    python -m benchmarks.overhead [--model mlp transformer deep100 deep500 bert] [--optimizer sgd adam]
                                  [--every 1 10 auto] [--pairs 15] [--block 20] [--device cpu|cuda] [--threads 1]
                                  [--arm monitor anomaly nullhooks onepass cockpit] [--give-optimizer]
                                  [--warmup N] [--warmup-checks N] [--clock wall|thread]
    python -m benchmarks.overhead --scaling [--layers 500 1000 2000]
    python -m benchmarks.overhead --entry [--layers 100 250 500 1000]

Each configuration builds the same model twice from one seed: one trains bare, the other
under ``NeuralDbg``. After a warm-up both train in alternating blocks of ``--block`` steps
(the order flips every pair, so drift and contention from other processes hit both arms) and
the ratio of the two blocks' times is one paired sample; the table gives the median and the
interquartile range of ``--pairs`` samples. ``--give-optimizer`` hands the optimizer to the
monitor (its step-size probe copies the weights on the first 16 checked steps). ``--every auto``
measures the default cadence (``every="auto"``: every step of the first 32, then an interval the
monitor chooses to hold its 3 % budget); its row also says which intervals the monitor chose
over the pairs' steps. The monitored arm warms up for ``--warmup`` steps and then until its
monitor has checked ``--warmup-checks`` steps (default 64: its start-up, some of it counted in
checks -- the step-size probe's copies, the update's dense non-finite checks, the first transfer
that builds the detectors, the ``auto`` cadence's dense start and probe); the bare arm runs as
many steps, and the extra time is reported apart as a one-time ``start-up`` cost.

``--arm`` picks what the second copy trains under: ``monitor`` (``NeuralDbg``), or a reference:
``anomaly`` (``torch.autograd.set_detect_anomaly(True)`` during its blocks), ``nullhooks``
(a forward hook on every monitored module and a post-accumulate-grad hook on every parameter,
all returning at once: the floor of any per-module hook) or ``onepass`` (one pass over the data
from torch alone: a forward hook that reduces each monitored output once, and one
``torch._foreach_norm`` of the gradients at the step: what every=1 is measured against); these
three ignore ``--every``.
``cockpit`` is Cockpit's economy configuration (``cockpit-for-pytorch``, installed separately)
tracking every ``--every``-th step, set up as its documentation does (BackPACK-extended model and
loss, the individual losses passed on every step); it runs on ``mlp``, ``deep100`` and ``deep500``.

``--scaling`` times a model of many small parallel layers (no events fire on it) and reports
the monitor's cost per monitored layer per checked step and the hook-registration time.
``--entry`` times ``NeuralDbg.__enter__`` and the first and a repeated query (``posterior()``,
``get_causal_hypotheses()``) on deep stacks of growing depth after 32 checked steps.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
import warnings
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.overhead_models import (MODELS, cockpit_for, make_deep, make_parallel, null_hooks, one_pass_gradients,
                                        one_pass_hooks)
from neuraldbg import NeuralDbg
from neuraldbg.monitor.cadence import AUTO
from neuraldbg.report.cadence import describe

#: the anchors the README compares against (published figures, not measured here)
ANCHORS = ("Cockpit's economy configuration: 1.51x at every step, 1.04x at every 16th step; "
           "torch.autograd.detect_anomaly: 2.5-3x")

ARMS = ("monitor", "anomaly", "nullhooks", "onepass", "cockpit")
#: the arms that measure only every Nth step (``--every``); the others ignore it
SCHEDULED = ("monitor", "cockpit")
#: steps the monitored arm's warm-up is extended by at a time, until its start-up is over
WARMUP_CHUNK = 16
#: checked steps the monitor's start-up lasts (the longest of its windows counted in checks: the
#: update's dense non-finite checks, ``neuraldbg/monitor/measurements/numerics.py``)
STARTUP_CHECKS = 64
OPTIMIZERS = {"sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
              "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3)}


class Arm:
    """One training run (bare, monitored or a reference) that can be advanced block by block."""

    def __init__(self, build: Callable, optimizer: str, device: str, every: int | str | None,
                 give_optimizer: bool = False, kind: str = "monitor") -> None:
        self.model, self.loss_fn = build(0, device)
        self.opt = OPTIMIZERS[optimizer](self.model.parameters())
        self.device = device
        self.i = 0
        self.dbg = None
        self.enter_s = 0.0
        self.anomaly = every is not None and kind == "anomaly"
        self.handles: list = []
        self.cockpit = None
        self.sink: list | None = None  # the one-pass reference's reductions of this step
        if every is not None and kind == "nullhooks":
            self.handles = null_hooks(self.model)
        elif every is not None and kind == "onepass":
            self.sink = []
            self.handles = one_pass_hooks(self.model, self.sink)
            self.params = [p for p in self.model.parameters() if p.requires_grad]
        elif every is not None and kind == "cockpit":
            self.model, self.cockpit, self.ce = cockpit_for(self.model, self.loss_fn, every)
        elif every is not None and kind == "monitor":
            self.dbg = NeuralDbg(self.model, every=every, optimizer=self.opt if give_optimizer else None)
            t0 = time.perf_counter()
            self.dbg.__enter__()
            self.enter_s = time.perf_counter() - t0

    def run(self, steps: int, clock: Callable[[], float] = time.perf_counter) -> float:
        """Train ``steps`` steps; their time in seconds on ``clock`` (wall time by default)."""
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        sync()
        if self.anomaly:  # process-wide: on during this arm's blocks only
            torch.autograd.set_detect_anomaly(True)
        t0 = clock()
        for _ in range(steps):
            self.opt.zero_grad(set_to_none=True)
            if self.cockpit is not None:
                self._cockpit_backward()
            else:
                loss = self.loss_fn(self.model, self.i)
                loss.backward()
                if self.dbg is not None:
                    self.dbg.record_loss(loss)
                if self.sink is not None:
                    one_pass_gradients(self.params, self.sink)
                    self.sink.clear()
            self.opt.step()
            self.i += 1
        sync()
        t = clock() - t0
        if self.anomaly:
            torch.autograd.set_detect_anomaly(False)
        return t

    def _cockpit_backward(self) -> None:
        """One step's forward and backward under Cockpit, as its documented loop runs them (the
        individual losses it reads, the graph kept on the steps it asks for)."""
        x, y = self.loss_fn.batch(self.i)
        out = self.model(x)
        loss = self.ce(out, y)
        losses = F.cross_entropy(out, y, reduction="none")
        info = {"batch_size": len(y), "individual_losses": losses, "loss": loss, "optimizer": self.opt}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # BackPACK's full backward hooks, every step
            with self.cockpit(self.i, info=info):
                loss.backward(create_graph=self.cockpit.create_graph(self.i))

    def close(self) -> None:
        """Leave the monitor (removes its hooks) or remove the reference hooks."""
        if self.dbg is not None:
            self.dbg.__exit__(None, None, None)
        for h in self.handles:
            h.remove()


def paired(build: Callable, optimizer: str, every: int | str, *, device: str, pairs: int, block: int,
           warmup: int, give_optimizer: bool = False, clock: Callable[[], float] = time.perf_counter,
           kind: str = "monitor", warmup_checks: int = 0) -> dict:
    """Alternating blocks of a bare and a monitored (or reference, ``kind``) run: per-pair
    ratios and step times.

    The monitored arm warms up for ``warmup`` steps and, past them, until its monitor has checked
    ``warmup_checks`` steps (its start-up: the step-size probe's weight copies, the update's dense
    non-finite checks, the first host transfer that builds the detectors, the ``"auto"``
    cadence's dense start and probe); the bare arm then runs as many steps. ``startup_ms`` is
    the monitored warm-up's extra time over the bare one: the one-time cost the ratio leaves
    out."""
    bare = Arm(build, optimizer, device, None)
    mon = Arm(build, optimizer, device, every, give_optimizer, kind)
    try:
        t_mon = mon.run(warmup, clock)
        n = warmup
        while mon.dbg is not None and mon.dbg.checks < warmup_checks:
            t_mon += mon.run(WARMUP_CHUNK, clock)
            n += WARMUP_CHUNK
        t_bare = bare.run(n, clock)
        ratios, tb, tm = [], [], []
        for i in range(pairs):
            if i % 2 == 0:
                b, m = bare.run(block, clock), mon.run(block, clock)
            else:
                m, b = mon.run(block, clock), bare.run(block, clock)
            ratios.append(m / b)
            tb.append(b / block)
            tm.append(m / block)
    finally:
        mon.close()
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"ratio": statistics.median(ratios), "q25": q[0], "q75": q[2], "bare_ms": statistics.median(tb) * 1e3,
            "mon_ms": statistics.median(tm) * 1e3, "enter_s": mon.enter_s, "ratios": ratios,
            "warmup_steps": n, "startup_ms": (t_mon - t_bare) * 1e3,
            "cadence": describe(mon.dbg.cadence) if mon.dbg is not None else ""}


def every_arg(text: str) -> int | str:
    """An ``--every`` value: an int >= 1 or ``auto``."""
    if text == AUTO:
        return AUTO
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'auto', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'auto', got {text!r}")
    return n


def every_columns(values: list[int | str]) -> list[int | str]:
    """The ``--every`` values as table columns: the ints in order, then ``auto``."""
    ints = sorted({v for v in values if v != AUTO})
    return ints + ([AUTO] if AUTO in values else [])


def scaling(layer_counts: list[int], *, device: str, pairs: int, block: int, warmup: int,
            clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """Per-layer cost of the monitor on :class:`Parallel` models of growing width (every=1)."""
    rows = []
    for n in layer_counts:
        r = paired(lambda seed, dev, n=n: make_parallel(n, seed, dev), "sgd", 1, device=device, pairs=pairs,
                   block=block, warmup=warmup, clock=clock)
        extra_us = (r["mon_ms"] - r["bare_ms"]) * 1e3
        rows.append({"layers": n, **r, "us_per_layer": extra_us / n})
        print(f"{n:5d} layers: bare {r['bare_ms']:8.2f} ms/step, monitored {r['mon_ms']:8.2f} ms/step, "
              f"ratio {r['ratio']:.3f}x [IQR {r['q25']:.3f}-{r['q75']:.3f}], "
              f"{extra_us / n:6.2f} us per monitored layer per checked step, hooks registered in "
              f"{r['enter_s'] * 1e3:.1f} ms", flush=True)
    return rows


class GCTime:
    """Seconds Python's cyclic garbage collector ran while the block ran (its full collections
    cost time in proportion to every object of the process, whoever allocated them)."""

    def __enter__(self) -> "GCTime":
        self.s, self._t0 = 0.0, 0.0
        gc.callbacks.append(self._cb)
        return self

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.s += time.perf_counter() - self._t0

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._cb)


def entry_times(layer_counts: list[int], *, device: str, steps: int = 32) -> list[dict]:
    """``NeuralDbg.__enter__`` and the queries on :class:`DeepStack` models of growing depth,
    after ``steps`` checked training steps (wall clock, seconds). A query on a one-layer model
    first: the causal engine's imports (pgmpy) are a one-time cost of the process, not of depth."""
    with NeuralDbg(nn.Linear(2, 2)) as warm:
        warm.posterior()
    rows = []
    for n in layer_counts:
        gc.collect()  # the previous model's garbage is not this one's cost
        model, loss_fn = make_deep(n, 0, device)
        opt = OPTIMIZERS["sgd"](model.parameters())
        dbg = NeuralDbg(model, every=1)
        with GCTime() as in_gc:
            t0 = time.perf_counter()
            dbg.__enter__()
            enter_s = time.perf_counter() - t0
        try:
            for i in range(steps):
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model, i)
                loss.backward()
                dbg.record_loss(loss)
                opt.step()
            t0 = time.perf_counter()
            dbg.posterior()
            first_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            dbg.get_causal_hypotheses()
            again_s = time.perf_counter() - t0
        finally:
            dbg.__exit__(None, None, None)
        modules = len(dbg.layers())
        rows.append({"layers": n, "modules": modules, "enter_s": enter_s, "enter_gc_s": in_gc.s,
                     "posterior_s": first_s, "hypotheses_s": again_s})
        print(f"{n:5d} layers ({modules} modules): __enter__ {enter_s * 1e3:7.1f} ms (of which the garbage "
              f"collector {in_gc.s * 1e3:6.1f} ms), first query (posterior) {first_s * 1e3:7.1f} ms, "
              f"get_causal_hypotheses {again_s * 1e3:7.1f} ms", flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    """Print the every x model x optimizer table (markdown) and return its rows."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--optimizer", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    ap.add_argument("--every", nargs="+", type=every_arg, default=[1, 10],
                    help="check intervals of the monitor (and Cockpit): ints >= 1, or auto (the default cadence)")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--block", type=int, default=20, help="steps per timed block")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps per arm first")
    ap.add_argument("--warmup-checks", type=int, default=STARTUP_CHECKS,
                    help="the monitored arm's warm-up goes on until its monitor has checked this many steps (its "
                         "start-up, timed apart as a one-time cost; 0: --warmup steps only)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--give-optimizer", action="store_true",
                    help="pass the optimizer to NeuralDbg (the step-size probe's copies on checked steps)")
    ap.add_argument("--arm", nargs="+", default=["monitor"], choices=list(ARMS),
                    help="what the second copy trains under: the monitor, or a reference (see above)")
    ap.add_argument("--scaling", action="store_true", help="the many-layer scaling figure instead")
    ap.add_argument("--entry", action="store_true", help="the __enter__ and query times on deep stacks instead")
    ap.add_argument("--layers", nargs="+", type=int, default=None,
                    help="layer counts of --scaling (default 500 1000 2000) or --entry (100 250 500 1000)")
    ap.add_argument("--clock", default="wall", choices=["wall", "thread"],
                    help="wall time (the published figures) or this thread's CPU time (steadier on a "
                         "loaded machine; CPU with one thread only)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here")
    if a.pairs < 1 or a.block < 1:
        ap.error("--pairs and --block must be >= 1")
    if AUTO in a.every and "cockpit" in a.arm:
        ap.error("--every auto is the monitor's cadence; Cockpit tracks fixed intervals: give it ints")
    if a.clock == "thread" and (a.device != "cpu" or a.threads != 1):
        ap.error("--clock thread measures one CPU thread: use it with --device cpu --threads 1")
    clock = time.thread_time if a.clock == "thread" else time.perf_counter
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, device {a.device}, {a.threads} thread(s), {a.pairs} pairs of "
          f"{a.block}-step blocks after {a.warmup} warm-up steps, optimizer "
          f"{'given' if a.give_optimizer else 'not given'} to the monitor, {a.clock} clock", flush=True)
    if a.scaling:
        return scaling(a.layers or [500, 1000, 2000], device=a.device, pairs=a.pairs, block=a.block,
                       warmup=a.warmup, clock=clock)
    if a.entry:
        return entry_times(a.layers or [100, 250, 500, 1000], device=a.device)
    rows = []
    for model in a.model:
        for opt in a.optimizer:
            for arm in a.arm:
                # a reference does not check every Nth step: one measurement stands for every column
                for every in (a.every if arm in SCHEDULED else a.every[:1]):
                    r = paired(MODELS[model], opt, every, device=a.device, pairs=a.pairs, block=a.block,
                               warmup=a.warmup, give_optimizer=a.give_optimizer, clock=clock, kind=arm,
                               warmup_checks=a.warmup_checks)
                    rows.append({"model": model, "optimizer": opt, "arm": arm, "every": every, **r})
                    label = f"every={every}" if arm in SCHEDULED else arm
                    print(f"  {model} {opt} {label}: {r['ratio']:.3f}x [IQR {r['q25']:.3f}-{r['q75']:.3f}] "
                          f"bare {r['bare_ms']:.2f} ms/step, other arm {r['mon_ms']:.2f} ms/step; start-up "
                          f"{r['startup_ms']:.0f} ms over {r['warmup_steps']} warm-up steps", flush=True)
                    if every == AUTO and r["cadence"]:
                        print(f"    {r['cadence']}", flush=True)
    cols = every_columns(a.every)
    print("\n| model | optimizer | arm | bare ms/step | " + " | ".join(f"every={e}" for e in cols) + " |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in cols) + " |")
    for model in a.model:
        for opt in a.optimizer:
            for arm in a.arm:
                cells = {r["every"]: r for r in rows if (r["model"], r["optimizer"], r["arm"]) == (model, opt, arm)}
                bare = statistics.median(c["bare_ms"] for c in cells.values())
                # a reference checks no step: its one figure stands under each column
                fmt = [f"{c['ratio']:.2f}x ({c['q25']:.2f}-{c['q75']:.2f})"
                       for c in ([cells[e] for e in cols] if arm in SCHEDULED else list(cells.values()) * len(cols))]
                print(f"| {model} | {opt} | {arm} | {bare:.2f} | " + " | ".join(fmt) + " |")
    print(f"\nmedian [IQR] of {a.pairs} paired block ratios. Anchors: {ANCHORS}.")
    return rows


if __name__ == "__main__":
    main()
