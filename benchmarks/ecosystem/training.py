"""What every ecosystem arch shares: the task record, and the training recipe people use.

The recipe is the one of a typical fine-tuning script: AdamW with weight decay (none on
biases and norm weights), linear warm-up then cosine decay, ``clip_grad_norm_(..., 1.0)``,
bf16 autocast on some runs and two-micro-batch gradient accumulation on others.
The runner in ``__init__`` drives it; the arch files only build a :class:`Task`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

#: Weight decay of every run (the usual AdamW default of fine-tuning scripts).
WEIGHT_DECAY = 0.01
#: Fraction of the run spent warming the learning rate up.
WARMUP_FRAC = 0.1
#: Gradient-norm clip of every run.
CLIP_NORM = 1.0

Batch = dict[str, Any]


@dataclass(frozen=True)
class Build:
    """What an arch's builder may depend on: the seed and the structural variant."""

    seed: int
    deep: bool = False  # the deep_unnormalized variant
    init_range: float = 1.0  # factor on a config's initializer_range (the config_range_* faults)


@dataclass
class Task:
    """One arch, built: the model to train, its data and its loss.

    ``batch(n)`` draws the next ``n`` examples as a dict of keyword arguments; ``loss(batch)``
    runs the model on it and returns a 0-d loss. The key names tell the injections where to
    strike: ``float_input`` (a float tensor the model reads), ``float_target`` (a float
    regression target), ``label_key`` (class labels, or next-token labels for an LM),
    ``token_key`` (token ids; ``embed`` is their embedding, for ``inputs_embeds``).
    """

    model: nn.Module
    batch: Callable[[int], Batch]
    loss: Callable[[Batch], torch.Tensor]
    lr: float
    batch_size: int
    float_input: str | None = None
    float_target: str | None = None
    label_key: str | None = None
    token_key: str | None = None
    token_labels: bool = False  # labels are token ids too (LMs): a vocabulary remap hits both
    vocab: int = 0
    embed: nn.Module | None = None
    scheduler: Callable[[torch.optim.Optimizer, int, int], Any] | None = None
    info: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EcoArch:
    """A registered ecosystem architecture; layer names are as NeuralDbg sees the model."""

    name: str
    family: str
    library: str  # the import that must succeed (tests skip on it)
    build: Callable[[Build], Task]
    task: str  # one line: the healthy task
    steps: int = 120
    inputs: str = "float"  # "float" or "tokens"
    target: str = "labels"  # "labels", "tokens" (LM) or "float"
    input_layer: str | None = None  # first module that sees the data
    init_layer: str | None = None  # first weight layer (init faults)
    deep_layer: str | None = None  # first module of the deep variant, None: no deep variant
    notes: str = ""
    #: the only faults run on this arch (``None``: every fault that applies); an expensive arch
    #: built for one mechanism runs that fault, its healthy twin and a few controls
    injections: tuple[str, ...] | None = None
    #: whether the suite's own run lists (full and quick) include this arch; an arch outside
    #: them runs only when named with explicit seeds (``--arch A --seeds N --healthy-seeds M``)
    in_suite: bool = True


# ----------------------------------------------------------------------------------------
# the recipe


def adamw(model: nn.Module, lr: float, **options: Any) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, decaying matrices only (biases, norms exempt);
    ``options`` go to ``torch.optim.AdamW`` as they are (a fault's ``eps``)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=lr, **options)


def cosine_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """The multiplier of ``get_cosine_schedule_with_warmup`` (transformers/diffusers)."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup  # +1: the first step already moves (transformers starts at 0)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return f


def torch_scheduler(opt: torch.optim.Optimizer, warmup: int, total: int):
    """Warm-up + cosine as plain-PyTorch scripts write it: a ``LambdaLR``."""
    return torch.optim.lr_scheduler.LambdaLR(opt, cosine_lambda(warmup, total))


def train_unmonitored(task: Task, opt: torch.optim.Optimizer, sched: Any, n: int) -> None:
    """``n`` steps of the recipe on ``task`` before the monitored run (a pre-training, the part
    of a run before its resume): fresh batches, the gradients clipped, ``sched`` stepped."""
    params = [p for p in task.model.parameters() if p.requires_grad]
    task.model.train()
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        task.loss(task.batch(task.batch_size)).backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        opt.step()
        sched.step()


def warmup_steps(total: int) -> int:
    """Warm-up length for a run of ``total`` optimizer steps."""
    return max(1, int(round(WARMUP_FRAC * total)))


#: Normalization layers ``strip_norms`` removes; library ones are matched by class name so
#: that this file imports no library.
NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.RMSNorm)
NORM_NAMES = ("LlamaRMSNorm", "RMSNorm", "T5LayerNorm")


def strip_norms(model: nn.Module) -> int:
    """Replace every normalization module by ``nn.Identity`` (public module API only).

    Returns how many were replaced, so builders can check they did remove something.
    """
    targets = []
    for _, parent in model.named_modules():
        for name, child in parent.named_children():
            if isinstance(child, NORM_TYPES) or type(child).__name__ in NORM_NAMES:
                targets.append((parent, name))
    for parent, name in targets:
        setattr(parent, name, nn.Identity())
    return len(targets)


def precision_of(seed: int) -> bool:
    """Whether run ``seed`` trains under bf16 autocast: odd seeds do."""
    return seed % 2 == 1


def accumulation_of(seed: int) -> int:
    """Micro-batches per optimizer step for run ``seed``: 2 on seeds 2, 3 (mod 4), else 1."""
    return 2 if seed % 4 >= 2 else 1
