"""Micro-benchmark of the causal engine's query latency (``python -m benchmarks.causal_latency``).

Times, after a warm-up query (prior file loaded, network compiled and cached):

* ``posterior``  -- ``neuraldbg.causal.api.posterior(trace)``: evidence extraction from the
  trace plus one exact enumeration; what ``dbg.posterior()`` costs after training;
* ``enumerate``  -- the compiled enumeration alone (``CompiledNetwork.posterior``);
* ``hypotheses`` -- ``api.hypotheses(trace)``: posterior plus building the ranked records;
* ``batch``      -- ``posterior_batch`` over many encoded cases, per case;
* ``compile``    -- building the network from the prior file (the one-time cost).

Traces are realistic: the event lists of a data-shift run (18 events) and a 20-layer sigmoid
stack (18 events on 39 layers). The goal is well under 1 ms per query (0.1 ms ideal).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Callable

from neuraldbg.causal import api
from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.cpd import build_cpds
from neuraldbg.causal.priors import load_priors
from neuraldbg.causal.structure import default_network
from neuraldbg.events.base import make_event
from neuraldbg.trace import LayerInfo, LossSummary, Trace
from neuraldbg.vocab import ACTIVATION, DATA, GRADIENT, OPTIMIZER


def _layers(depth: int, act: str) -> tuple[LayerInfo, ...]:
    out = []
    for i in range(depth):
        out.append(LayerInfo(str(len(out)), "Linear", len(out), 4160))
        if i < depth - 1:
            out.append(LayerInfo(str(len(out)), act, len(out), 0))
    return tuple(out)


def _loss(values: list[float]) -> LossSummary:
    finite = [v for v in values if math.isfinite(v)]
    return LossSummary(n=len(values), first=values[0], last=values[-1], min=min(finite),
                       history=tuple(enumerate(values)))


def shift_trace() -> Trace:
    """Inputs x1000 from step 30 of a 3-layer MLP (what the monitor emits)."""
    ev = [make_event(GRADIENT, "exploding", str(l), 30, 6.0, {"grad_rms": 6.5}, end_step=33) for l in (0, 2, 4)]
    ev += [make_event(OPTIMIZER, "spike", None, 30, 27.0, {"robust_z": 27.0}, end_step=33),
           make_event(DATA, "shift", "0", 30, 25.0, {"scale_ratio": 982.0}, end_step=59),
           make_event(OPTIMIZER, "divergence", None, 32, 3.0, {}, end_step=35),
           make_event(ACTIVATION, "dead", "3", 34, 1.0, {"dead_frac": 1.0}, end_step=59),
           make_event(OPTIMIZER, "plateau", None, 49, 1.0, {}, end_step=59)]
    ev += [make_event(GRADIENT, "vanishing", str(l), 34, 5.0, {"out_rms": 1e6}, end_step=51) for l in (0, 2)]
    ev += [make_event(GRADIENT, "exploding", str(l), 52, 6.0, {"grad_rms": 4e4}, end_step=54) for l in (0, 2, 4)]
    ev += [make_event(GRADIENT, "vanishing", str(l), 55, 5.0, {}, end_step=59) for l in (0, 2)]
    losses = [0.7 * 0.98 ** i for i in range(30)] + [30.0 + i for i in range(30)]
    return Trace(events=tuple(ev), layers=_layers(3, "ReLU"), family="mlp", last_step=59, loss=_loss(losses))


def sigmoid_trace() -> Trace:
    """A 20-layer sigmoid MLP: vanishing gradients in 17 layers from step 0, then a plateau."""
    layers = _layers(20, "Sigmoid")
    ev = [make_event(GRADIENT, "vanishing", li.name, 0, 5.0, {"out_rms": 0.3}, end_step=59)
          for li in layers if li.type == "Linear"][:17]
    ev.append(make_event(OPTIMIZER, "plateau", None, 55, 1.0, {}, end_step=59))
    return Trace(events=tuple(ev), layers=layers, family="mlp", last_step=59,
                 loss=_loss([0.69 * (1 + 0.003 * math.sin(i)) for i in range(60)]))


def timeit(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    """Median / p90 / min wall time of ``fn`` in microseconds over ``repeat`` calls."""
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e6)
    ts.sort()
    return {"median_us": statistics.median(ts), "p90_us": ts[int(0.9 * (len(ts) - 1))], "min_us": ts[0]}


def run(repeat: int = 2000) -> dict[str, dict[str, float]]:
    """All timings, keyed by name (see the module docstring)."""
    shift, sig = shift_trace(), sigmoid_trace()
    pri = load_priors("mlp")
    net = api.compiled(pri)
    ev = api.evidence(shift).observed
    out = {
        "posterior(shift trace)": timeit(lambda: api.posterior(shift), repeat),
        "posterior(sigmoid trace)": timeit(lambda: api.posterior(sig), repeat),
        "enumerate only": timeit(lambda: net.posterior(ev), repeat),
        "hypotheses(shift trace)": timeit(lambda: api.hypotheses(shift), max(repeat // 4, 10)),
    }
    n = 10000
    codes = net.cases([ev] * n)
    b = timeit(lambda: net.posterior_batch(codes), 5)
    out[f"batch per case (n={n})"] = {k: v / n for k, v in b.items()}
    net = default_network()
    out["compile (one-time)"] = timeit(lambda: CompiledNetwork(build_cpds(pri.roots, pri.cpds, net), net), 20)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the timings (``--json`` for machine-readable output)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.causal_latency", description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2000, help="timed calls per query (default 2000)")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    res = run(args.repeat)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{'query':32s} {'median':>10s} {'p90':>10s} {'min':>10s}")
    for name, r in res.items():
        print(f"{name:32s} {r['median_us']:8.1f}us {r['p90_us']:8.1f}us {r['min_us']:8.1f}us")
    ok = res["posterior(shift trace)"]["median_us"] < 1000
    print(f"goal: a query well under 1 ms -> {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
