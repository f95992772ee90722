"""Numbers that leave their dtype, as training scripts get them (and their healthy twins): the
ecosystem faults of the ``numerics`` root.

- weights in half precision under Adam's default ``eps=1e-8`` (``model.half()``): 1e-8 is below
  half of fp16's smallest subnormal (6e-8) and rounds to 0 there, and so does the second moment
  ``0.001 * g**2`` of every gradient element under 5.5e-3 (most of them once the gradient norm is
  clipped to 1: 86 % and 93 % of the plain-torch MLP's and encoder's at the first step), so the
  first update divides by zero (``x/0 = inf``, ``0/0 = NaN``) with every input, activation, loss
  and gradient finite (:func:`cast_weights`);
- ``eps=0`` in fp32 (a fudge term "removed"): a coordinate whose first gradient is exactly zero
  (a ReLU unit dead on the whole batch, a key bias, which softmax's shift invariance leaves
  without gradient, an embedding row no token of the batch reads) gets ``0/0 = NaN`` in the
  first update;
- weights in bf16 (``model.to(torch.bfloat16)``) at a small rate: bf16 keeps 8 significant bits,
  so an update under ``|w| * 2**-9`` rounds back to ``w``; Adam's update is about the rate per
  element, and most elements stay where they were although their gradients are not zero;
- the healthy twins: fp32 master weights with the forward under bf16 autocast at the same small
  rate, and fp32 weights under fp16 autocast with a ``torch.amp.GradScaler`` (:func:`grad_scaler`),
  the way mixed precision is meant to be written.

A fault's ``autocast`` (:data:`AUTOCAST`) says how its forward runs, in place of the recipe's bf16
autocast on odd seeds: a script that calls ``model.half()`` runs no autocast, and a twin written
for autocast runs it on every seed.
"""
from __future__ import annotations

import torch

from benchmarks.ecosystem.training import Batch, Task, precision_of

#: A fault's forward precision: ``recipe`` (bf16 autocast on odd seeds, as every other fault),
#: ``off`` (no autocast on any seed), ``bf16`` or ``fp16`` (that autocast on every seed; fp16 with a
#: GradScaler, which fp16 gradients need to stay above its underflow)
AUTOCAST: dict[str, torch.dtype | None] = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
#: the small rate of the bf16 faults: the encoder's fp32 run learns clearly at it within its 120
#: steps (loss 1.40 -> 0.88), while its weights in bf16 keep 84-86 % of their matrices' elements
#: unchanged per step (loss 1.40 -> 1.22, flat from mid-run): the warm-up and the cosine keep the
#: rate under its peak most of the run, and Adam's update falls under the rate once the gradients
#: are noisy, so the updates sit under ``|w| * 2**-9`` for most elements (the matrices' median
#: ``|w| * 2**-9`` is 1.2e-4..2.1e-4 in the linear layers, 1.3e-3 in the embeddings)
SMALL_LR = 3e-4


def autocast_dtype(mode: str, seed: int) -> torch.dtype | None:
    """The dtype the forward of run ``seed`` autocasts to under ``mode`` (:data:`AUTOCAST`),
    ``None`` for none."""
    if mode == "recipe":
        return torch.bfloat16 if precision_of(seed) else None
    try:
        return AUTOCAST[mode]
    except KeyError:
        raise ValueError(f"unknown autocast {mode!r}; valid: recipe, {', '.join(AUTOCAST)}") from None


def grad_scaler(amp: torch.dtype | None) -> torch.amp.GradScaler | None:
    """The ``GradScaler`` an fp16 autocast loop needs (its gradients underflow without one),
    ``None`` for any other precision: bf16 shares fp32's range and needs none."""
    return torch.amp.GradScaler("cpu") if amp == torch.float16 else None


def cast_weights(task: Task, dtype: torch.dtype) -> None:
    """Convert ``task.model`` to ``dtype`` (``model.half()``, ``model.to(torch.bfloat16)``) and
    cast its float input to match, as a user must for the first layer to accept it; the batches
    are cast where they are drawn, so a replay of the run draws them cast too. Targets stay as
    they are: the tasks' losses read their logits in float, as scripts do (``logits.float()``)."""
    task.model.to(dtype)
    if task.float_input is None:
        return
    draw, key = task.batch, task.float_input

    def batch(n: int) -> Batch:
        bt = dict(draw(n))
        bt[key] = bt[key].to(dtype)
        return bt

    task.batch = batch
