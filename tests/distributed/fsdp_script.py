"""FSDP2 (``fully_shard``) on CPU with two gloo ranks and a NeuralDbg on each, for
tests/distributed/test_fsdp.py. Two modes:

* ``python fsdp_script.py OUT scenarios`` under ``torchrun --nproc_per_node 2``: a healthy run,
  a learning rate far too high and a NaN batch on rank 1, each exported per rank, with rank 0's
  live-merged diagnosis written next to them; the healthy run is repeated without the monitor
  and the ranks' shards compared bitwise.
* ``python fsdp_script.py OUT kill`` started once per rank with ``RANK``/``WORLD_SIZE``/``MASTER_*``
  set (not under torchrun, whose agent would stop the survivor): rank 1 autosaves on every
  checked step and SIGKILLs itself mid-run; rank 0 writes how long its exit took and what the
  merge made of the missing rank.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.session import export_trace

STEPS = 24
NAN_STEP = 12
KILL_STEP = 10
SCENARIOS = {"healthy": 1e-2, "lr_high": 30.0, "nan_rank1": 1e-2}  # Adam learning rates


def make_model() -> nn.Module:
    """A 3-layer MLP, each linear layer and the whole sharded (FSDP2)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    return model


def train(model, opt, rank, nan_step=None, dbg=None, kill_step=None):
    """The loop, unchanged whether monitored or not: each rank its own shard of data."""
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        x = torch.randn(16, 8, generator=gen)
        y = x[:, :3].argmax(dim=1)
        if step == nan_step and rank == 1:
            x[0, 0] = float("nan")
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if dbg is not None:
            dbg.record_loss(loss)
        opt.step()
        if step == kill_step and rank == 1:
            time.sleep(1.0)  # the autosave of the last checked step lands (a background write)
            os.kill(os.getpid(), signal.SIGKILL)


def summary(dbg) -> dict:
    """What rank 0's live-merged monitor answers."""
    cov = dbg.coverage()
    return {"p_healthy": dbg.posterior().p_healthy, "internal_errors": dbg.internal_errors,
            "coverage_internal_errors": cov.internal_errors, "coverage": cov.summary(),
            "unobserved_ranks": cov.unobserved_ranks,
            "hypotheses": [[h.cause, h.state, h.onset_step, h.origin_layer, h.origin_rank]
                           for h in dbg.get_causal_hypotheses()]}


def scenarios(out: str) -> None:
    rank = dist.get_rank()
    for name, lr in SCENARIOS.items():
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        with NeuralDbg(model, optimizer=opt) as dbg:
            train(model, opt, rank, nan_step=NAN_STEP if name == "nan_rank1" else None, dbg=dbg)
        dbg.export_aquarium_package(f"{out}/{name}_rank{rank}.json")
        result = {"internal_errors": dbg.internal_errors, "merged": dbg.merged_trace is not None}
        if rank == 0:
            result.update(summary(dbg))
            export_trace(dbg.merged_trace, f"{out}/{name}_live.json", config=dbg.config.to_dict(), priors=dbg.priors)
        if name == "healthy":  # the same run without the monitor: every shard bitwise the same
            bare = make_model()
            bare_opt = torch.optim.Adam(bare.parameters(), lr=lr)
            train(bare, bare_opt, rank)
            result["bitwise"] = all(torch.equal(a.to_local(), b.to_local())
                                    for a, b in zip(model.parameters(), bare.parameters()))
            result["sharded"] = all(type(p).__name__ == "DTensor" for p in model.parameters())
        with open(f"{out}/{name}_result{rank}.json", "w") as f:
            json.dump(result, f)


def kill(out: str) -> None:
    rank = dist.get_rank()
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    result: dict = {}
    failed_at = None
    try:
        with NeuralDbg(model, optimizer=opt, autosave=f"{out}/kill_rank{rank}.json", autosave_interval=0.0,
                       merge_timeout=3.0) as dbg:
            try:
                train(model, opt, rank, dbg=dbg, kill_step=KILL_STEP)
            except Exception as exc:  # rank 1 is gone: the next collective fails
                failed_at = time.monotonic()
                result["error"] = repr(exc)[:200]
                raise
    except Exception:  # noqa: BLE001 - expected on the survivor
        pass
    result["exit_seconds"] = None if failed_at is None else time.monotonic() - failed_at
    result.update(summary(dbg))
    with open(f"{out}/kill_result{rank}.json", "w") as f:
        json.dump(result, f)
    os._exit(0)  # the process group lost a rank: do not wait for it in its teardown


if __name__ == "__main__":
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[rank %(process)d] %(levelname)s %(message)s"))
    logging.getLogger("neuraldbg").addHandler(handler)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out_dir, mode = sys.argv[1], sys.argv[2]
    if mode == "kill":
        kill(out_dir)
    else:
        scenarios(out_dir)
        dist.destroy_process_group()
