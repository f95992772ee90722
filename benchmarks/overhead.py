"""Step-time overhead of the monitor: paired runs, alternating in one process.

    python -m benchmarks.overhead [--steps 200] [--pairs 15] [--hidden 512] [--device cpu]

Each pair trains the same model from the same seed once bare and once under ``NeuralDbg``
(order alternating, so drift and warm caches hit both arms); the ratio of the two step
times is taken per pair and the median reported, for ``every=1`` and ``every=10``.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg


def make_mlp(hidden: int, seed: int, device: str) -> nn.Module:
    """A CPU-sized MLP: 64 -> hidden -> hidden -> hidden -> 10 (~0.6M parameters at 512)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(device)


def timed_run(hidden: int, steps: int, every: int | None, device: str, batch: int = 128,
              with_optimizer: bool = False) -> float:
    """Seconds per step of one training run (``every=None``: no monitor); ``with_optimizer``
    hands the optimizer to the monitor, which then measures the step size on checked steps."""
    model = make_mlp(hidden, 0, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(0)
    xs = torch.randn(8, batch, 64, generator=gen, device=device)
    ys = torch.randint(0, 10, (8, batch), generator=gen, device=device)
    dbg = NeuralDbg(model, family="mlp", every=every, optimizer=opt if with_optimizer else None) if every else None
    with dbg if dbg else contextlib.nullcontext():
        for step in range(steps + 5):
            if step == 5:  # warm-up excluded
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xs[step % 8]), ys[step % 8])
            loss.backward()
            if dbg:
                dbg.record_loss(loss)
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> dict[int, float]:
    """Print and return the median paired overhead ratio for every=1 and every=10."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--optimizer", action="store_true",
                    help="pass the optimizer to NeuralDbg (adds the step-size probe's copies on checked steps)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    n_params = sum(p.numel() for p in make_mlp(a.hidden, 0, "cpu").parameters())
    print(f"MLP with {n_params:,} parameters, batch 128, {a.steps} steps x {a.pairs} pairs, device {a.device}, "
          f"torch threads {a.threads}, optimizer {'given' if a.optimizer else 'not given'} to the monitor")
    out = {}
    for every in (1, 10):
        ratios, bare_t, mon_t = [], [], []
        for i in range(a.pairs):
            if i % 2 == 0:
                b = timed_run(a.hidden, a.steps, None, a.device)
                m = timed_run(a.hidden, a.steps, every, a.device, with_optimizer=a.optimizer)
            else:
                m = timed_run(a.hidden, a.steps, every, a.device, with_optimizer=a.optimizer)
                b = timed_run(a.hidden, a.steps, None, a.device)
            ratios.append(m / b)
            bare_t.append(b)
            mon_t.append(m)
        out[every] = statistics.median(ratios)
        print(f"every={every:<3d} bare {statistics.median(bare_t) * 1e3:7.3f} ms/step   monitored "
              f"{statistics.median(mon_t) * 1e3:7.3f} ms/step   ratio (median of {a.pairs} pairs) {out[every]:.3f}x"
              f"   [IQR {statistics.quantiles(ratios, n=4)[0]:.3f}-{statistics.quantiles(ratios, n=4)[2]:.3f}]")
    return out


if __name__ == "__main__":
    main()
