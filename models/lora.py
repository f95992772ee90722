"""lora: LoRA fine-tuning of a small pre-trained transformer onto a related language.

Task A: the transformer of ``transformer.py`` is pre-trained in-process on language A
(``pretrain_steps`` = 200 steps; the result is cached per seed and base config, so a second
run in the same process skips it). Task B: a sub-language made of 8 of A's words with its
own successor chain. The base is frozen; our own :class:`LoRALinear` adapters (rank 4, ``B``
zero-initialised so fine-tuning starts at the pre-trained function) wrap every attention
and MLP projection, and only they train, on task B.

The loss is task B's; the ``task_a_loss`` signal (every 10 steps, on a fixed held-out batch
of language A) measures forgetting, with the pre-trained value in
``metrics["task_a_before"]``. A healthy fine-tune costs task A about 0.5 nats; the
forgetting injection about three times that, for the same task-B result. A monitored run
hands the same held-out loss to ``NeuralDbg(reference=...)``, as a user who cares about
forgetting would.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from models.injections import Injection, register_general, register_injection
from models.registry import ArchSpec, Trainer, register_arch, set_lr, warmup_lr
from models.transformer import GPT, MarkovText, TransformerConfig, lm_loss


@dataclass
class LoRAConfig:
    """Hyper-parameters of the LoRA reference run (the healthy defaults)."""
    base: TransformerConfig = field(default_factory=TransformerConfig)
    pretrain_steps: int = 200
    language_a: int = 0
    language_b: int = 1  # task B: a sub-language of A's first b_words words, its own chain
    b_words: int = 8
    rank: int = 4
    alpha: float = 8.0  # adapter output is scaled by alpha / rank
    targets: tuple[str, ...] = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    batch_size: int = 16
    steps: int = 150
    lr: float = 1e-3
    warmup: int = 10
    init_gain: float = 1.0  # scales A's init
    b_init_std: float = 0.0  # B's init: zero, so step 0 is exactly the pre-trained model
    # how bad "bad" is
    lr_high: float = 0.3  # 300x: task-B loss spikes
    lr_low: float = 1e-7


class LoRALinear(nn.Module):
    """``base(x) + (alpha / r) * x A^T B^T`` with ``base`` frozen; A: (r, in), B: (out, r)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, a_gain: float = 1.0,
                 b_std: float = 0.0) -> None:
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear, as in the paper
        with torch.no_grad():
            self.lora_A.mul_(a_gain)
            if b_std > 0:
                self.lora_B.normal_(0.0, b_std)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in) -> (..., out)
        return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling


def add_lora(model: nn.Module, cfg: LoRAConfig) -> list[nn.Parameter]:
    """Freeze ``model`` and wrap each target Linear in a :class:`LoRALinear`; return A/B params."""
    for p in model.parameters():
        p.requires_grad_(False)
    params = []
    for block in model.blocks:
        for target in cfg.targets:
            parent_name, attr = target.rsplit(".", 1)
            parent = block.get_submodule(parent_name)
            lora = LoRALinear(getattr(parent, attr), cfg.rank, cfg.alpha, cfg.init_gain,
                              cfg.b_init_std)
            setattr(parent, attr, lora)
            params += [lora.lora_A, lora.lora_B]
    return params


_PRETRAINED: dict[tuple, dict[str, torch.Tensor]] = {}


def pretrained_base(cfg: LoRAConfig, seed: int) -> GPT:
    """The base transformer trained on language A; cached per (seed, base config, steps).

    Pre-training runs under its own forked RNG, so cached and fresh results are identical.
    """
    key = (seed, repr(cfg.base), cfg.pretrain_steps, cfg.language_a)
    if key not in _PRETRAINED:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1_000_000 + seed)
            model = GPT(cfg.base)
            text = MarkovText(cfg.language_a, seed)
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.base.lr, betas=(0.9, 0.99),
                                    weight_decay=0.0)
            for step in range(cfg.pretrain_steps):
                x, y = text.batch(cfg.base.batch_size, cfg.base.block_size)
                opt.zero_grad(set_to_none=True)
                lm_loss(model, x, y).backward()
                set_lr(opt, warmup_lr(cfg.base.lr, step, cfg.base.warmup))
                opt.step()
        _PRETRAINED[key] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model = GPT(cfg.base)
    model.load_state_dict(copy.deepcopy(_PRETRAINED[key]))
    return model


class LoRATrainer(Trainer):
    """AdamW on the adapters only, task-B next-char loss; task-A loss every 10 steps."""

    signal_every = 10

    def __init__(self, cfg: LoRAConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        self.model = pretrained_base(cfg, seed)  # the global RNG is untouched by the cache
        words_a = MarkovText(cfg.language_a, seed, length=1).words
        self.text_b = MarkovText(cfg.language_b, seed, n_words=cfg.b_words, words=words_a)
        eval_a = MarkovText(cfg.language_a, seed + 7919)  # held out: another stream of A
        self.xa, self.ya = eval_a.batch(64, cfg.base.block_size)
        self.task_a_before = self.task_a_loss()
        params = add_lora(self.model, cfg)
        inj.apply_model(self.model, cfg, self)
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)

    def task_a_loss(self) -> torch.Tensor:
        """Language-A loss on the fixed held-out batch."""
        with torch.no_grad():
            return lm_loss(self.model, self.xa, self.ya)

    def monitor_defaults(self) -> dict:
        """The pre-trained task as the monitor's reference: what a user who cares about
        forgetting hands ``NeuralDbg(model, reference=...)``, every ``signal_every`` steps."""
        return {"reference": lambda model: lm_loss(model, self.xa, self.ya), "reference_every": self.signal_every}

    def forward_backward(self, step: int) -> torch.Tensor:
        x, y = self.text_b.batch(self.cfg.batch_size, self.cfg.base.block_size)
        pad = torch.zeros_like(x, dtype=torch.bool)
        x, y, pad = self.inj.apply_batch((x, y, pad), step)
        self.inj.zero_grad(self.optimizer, step)
        loss = lm_loss(self.model, x, y, pad)
        loss.backward()
        return loss

    def optimizer_step(self, step: int) -> None:
        set_lr(self.optimizer, warmup_lr(self.cfg.lr, step, self.cfg.warmup))
        super().optimizer_step(step)

    def signals(self, step: int) -> dict:
        if step % self.signal_every and step != self.cfg.steps - 1:
            return {}
        return {"task_a_loss": self.task_a_loss()}

    def summary(self) -> dict[str, float]:
        return {"task_a_before": float(self.task_a_before),
                "task_a_after": float(self.task_a_loss())}


SPEC = register_arch(ArchSpec(
    name="lora", family="lora", config=LoRAConfig, trainer=LoRATrainer,
    task="LoRA (rank 4) on a transformer pre-trained on language A, fine-tuned on a "
         "sub-language B (8 of A's words, another chain); task-A loss measures forgetting",
    input_layer="wte", symptoms={"lr_too_high": "worse"},
    notes="pre-training (200 steps) is cached per seed in-process; excluded from wall_time",
))
# init_too_small is left out: with B zero-initialised the adapters start at zero anyway,
# and Adam rescales a tiny A's gradients, so it trains like the healthy run.
register_general("lora", ("healthy", "lr_too_high", "lr_too_low"))

register_injection(Injection(
    name="lora_forgetting", archs=("lora",), truth=("learning_rate", "too_high"),
    symptom="forgetting",
    description="fine-tune LR 50x too high (5e-2): task B is learned as well as by the healthy "
                "run, but the adapters overwrite the pre-trained function and task-A loss "
                "rises about 3x more",
    why="the same adapters, data and steps at the healthy LR keep most of task A; the "
        "size of the updates is what destroys it",
    config=lambda c: replace(c, lr=5e-2),
))

register_injection(Injection(
    name="init_too_large", archs=("lora",), truth=("initialization", "too_large"),
    symptom="forgetting",
    description="adapter B matrices initialised N(0, 1) instead of zero: from step 0 the "
                "adapters add a large random perturbation to every projection, task-A loss "
                "jumps before any update and task B starts far off",
    why="only the adapters' initial scale changed; LoRA zero-initialises B precisely so "
        "that fine-tuning starts at the pre-trained function",
    config=lambda c: replace(c, b_init_std=1.0),
))
