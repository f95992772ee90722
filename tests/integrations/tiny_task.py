"""A tiny seeded task shared by the framework-callback tests: the examples' MLP on a teacher
task, pre-generated batches, and the plain monitored loop the callbacks are compared with."""
from __future__ import annotations

import logging
import re
import sys

import torch
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.examples import build_model

LR = 0.05          # the examples' healthy SGD learning rate for the MLP
STEPS = 50
#: a too-high learning rate as the diagnosis's sentences name it ("learning rate too high (p = 1.00)")
LR_TOO_HIGH = re.compile(r"learning rate too high \(p = ")


def make_model(seed: int = 0) -> torch.nn.Module:
    """The examples' 3-layer ReLU MLP (16 -> 64 -> 64 -> 4), seeded."""
    torch.manual_seed(seed)
    return build_model("mlp")


def batches(n: int, seed: int = 0, size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of Gaussian inputs labelled by a random linear teacher."""
    gen = torch.Generator().manual_seed(seed + 1)
    teacher = torch.randn(16, 4, generator=gen)
    out = []
    for _ in range(n):
        x = torch.randn(size, 16, generator=gen)
        out.append((x, (x @ teacher).argmax(1)))
    return out


def optimizer(params, lr: float) -> torch.optim.Optimizer:
    """The examples' optimizer."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def plain_run(lr: float, seed: int = 0, steps: int = STEPS, accum: int = 1) -> NeuralDbg:
    """The same model, data and optimizer in a plain loop under ``NeuralDbg``."""
    model = make_model(seed)
    opt = optimizer(model.parameters(), lr)
    data = iter(batches(steps * accum, seed))
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            dbg.step = step
            opt.zero_grad()
            for _ in range(accum):
                x, y = next(data)
                loss = F.cross_entropy(model(x), y)
                (loss / accum).backward()
                dbg.record_loss(loss)
            opt.step()
    return dbg


def top_cause(dbg) -> tuple[str, str] | None:
    """``(cause, state)`` of the top hypothesis, ``None`` when there is none."""
    hyps = dbg.get_causal_hypotheses()
    return (hyps[0].cause, hyps[0].state) if hyps else None


def log_to_stderr() -> None:
    """What an application of a distributed test does: the ``neuraldbg`` logger on stderr, at
    INFO, in every process (the test counts what each rank printed)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.getLogger("neuraldbg").addHandler(handler)
    logging.getLogger("neuraldbg").setLevel(logging.INFO)
