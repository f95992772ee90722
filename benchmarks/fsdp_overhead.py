"""Wall time per training step under FSDP2, with and without NeuralDbg (``every=1`` and ``every=10``).

Two gloo ranks on CPU, a 3-layer MLP with each linear layer and the whole sharded by
``fully_shard``. Each pair runs the same loop bare and monitored (alternating which goes first),
after a warm-up; rank 0 prints the median time per step of each and the ratio. Run::

    torchrun --nproc_per_node 2 benchmarks/fsdp_overhead.py [--width 256] [--steps 200] [--pairs 3]

The numbers are recorded in ``docs/distributed.md``; this is a measurement, not a test.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F

from neuraldbg import NeuralDbg


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    return model


def run(width: int, steps: int, every: int | None) -> float:
    """Seconds per step of ``steps`` steps (``every=None``: no monitor)."""
    model = make_model(width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(dist.get_rank())
    data = [(x, x[:, :10].argmax(1)) for x in (torch.randn(64, 32, generator=gen) for _ in range(steps))]
    dbg = NeuralDbg(model, optimizer=opt, every=every) if every is not None else None

    def loop():
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if dbg is not None:
                dbg.record_loss(loss)
            opt.step()

    dist.barrier()
    t0 = time.perf_counter()
    if dbg is None:
        loop()
    else:
        with dbg:
            loop()
    dist.barrier()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    run(args.width, 20, None)  # warm-up: process group, allocator, FSDP lazy init
    run(args.width, 20, 1)
    for every in (1, 10):
        bare, mon = [], []
        for i in range(args.pairs):
            order = (None, every) if i % 2 == 0 else (every, None)
            for e in order:
                (bare if e is None else mon).append(run(args.width, args.steps, e))
        if dist.get_rank() == 0:
            b, m = statistics.median(bare), statistics.median(mon)
            print(f"every={every:<3} bare {b * 1e3:.3f} ms/step  monitored {m * 1e3:.3f} ms/step  "
                  f"ratio {m / b:.3f}  (median of {args.pairs} pairs, {args.steps} steps, width {args.width})",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
