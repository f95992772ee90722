"""The monitor's memory over a long run: Python objects it holds and process RSS.

    python -m benchmarks.memory [--steps 1000 20000] [--json OUT.json]

A tiny MLP trains for the largest step count with a ``NeuralDbg`` around the loop; at each
checkpoint the script records
- ``traced_kib``: Python heap allocated since the monitor was entered and still alive
  (``tracemalloc``; torch tensor storage is not in it, and the loop allocates no lasting
  Python objects of its own, so growth here is the monitor's),
- ``rss_mib``: the process's resident set size (``/proc/self/status``, Linux),
- the monitor's own bounded structures: events and loss-history points.
Three scenarios: ``healthy`` (no events), ``persistent`` (a layer is dead from the start, so
a detector hits on every step: collapsing must keep it one event) and ``flicker`` (every 100
steps, 5 batches at 50x scale: a recurring data shift, 200 episodes in 20,000 steps, which
the event log caps at ``MAX_EPISODES`` records per key).
"""
from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc

import torch
from torch import nn
from torch.nn import functional as F


def rss_mib() -> float:
    """Resident set size of this process in MiB (NaN where /proc is not available)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def make_model(scenario: str) -> nn.Module:
    """The benchmark MLP; ``persistent`` kills the first ReLU (bias far negative)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    if scenario == "persistent":
        with torch.no_grad():
            model[0].bias.fill_(-100.0)
    return model


def run(scenario: str, checkpoints: list[int], warmup: bool = True) -> list[dict]:
    """Train to ``max(checkpoints)`` steps under the monitor; one measurement per checkpoint."""
    from neuraldbg import NeuralDbg

    if warmup:
        # lazy imports and first-use caches (detectors, numpy, the causal engine's modules)
        # are one-off process costs, not the monitor's per-run memory: pay them untraced
        run(scenario, [50], warmup=False)
    model = make_model(scenario)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(64, 32, 16, generator=gen)  # a fixed pool of batches: no data growth
    ys = xs[..., :4].argmax(dim=-1)
    rows = []
    gc.collect()
    rss0 = rss_mib()
    tracemalloc.start()
    t0 = time.perf_counter()
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(max(checkpoints)):
            x, y = xs[step % 64], ys[step % 64]
            if scenario == "flicker" and step >= 200 and step % 100 < 5:
                x = x * 50
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            if step + 1 in checkpoints:
                events = dbg.events  # what a query does: every pending transfer is part of the cost
                gc.collect()
                cur, peak = tracemalloc.get_traced_memory()
                rows.append({"scenario": scenario, "steps": step + 1, "traced_kib": round(cur / 1024, 1),
                             "traced_peak_kib": round(peak / 1024, 1), "rss_mib": round(rss_mib(), 1),
                             "rss_growth_mib": round(rss_mib() - rss0, 1), "events": len(events),
                             "event_count_sum": sum(e.count for e in events),
                             "loss_points": len(dbg.trace().loss.history),
                             "seconds": round(time.perf_counter() - t0, 1)})
    tracemalloc.stop()
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    """Command-line entry point: print a table (and optionally write JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[1000, 20000])
    ap.add_argument("--scenario", nargs="+", default=["healthy", "persistent", "flicker"],
                    choices=["healthy", "persistent", "flicker"])
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [r for sc in args.scenario for r in run(sc, sorted(args.steps))]
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
