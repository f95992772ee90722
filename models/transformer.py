"""transformer: a nanoGPT-style character model on a generated text.

The text is a seeded word-level Markov chain over a small invented vocabulary ("kelo mab
runi kelo ..."), so the model has things to learn at every scale: letters inside a word
(deterministic once the word is recognised), word boundaries, and which word follows which.
Pre-LayerNorm GPT blocks, causal self-attention written out (so the softmax is a module the
monitor can watch), AdamW with a linear warm-up, as in nanoGPT.

``lora.py`` reuses :class:`GPT` and :class:`MarkovText`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.injections import ONSET_FRAC, Injection, register_general, register_injection
from models.registry import ArchSpec, Trainer, register_arch, scale_weights, set_lr, warmup_lr

ALPHABET = " abcdefghijklmnopqrstuvwxyz."  # id 0 is the space


@dataclass
class TransformerConfig:
    """Hyper-parameters of the Transformer reference run (the healthy defaults)."""
    vocab_size: int = len(ALPHABET)
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    residual: bool = True
    batch_size: int = 16
    steps: int = 200
    lr: float = 1e-2
    warmup: int = 30
    weight_decay: float = 0.0
    init_std: float = 0.02
    init_gain: float = 1.0
    text_seed_offset: int = 0  # which generated "language" (LoRA's task B uses another)
    # how bad "bad" is
    lr_high: float = 0.3  # 30x
    lr_low: float = 1e-6  # 1e-4x
    init_small: float = 1e-3
    init_large: float = 100.0
    qk_gain: float = 1.0  # attention_collapse multiplies the query/key weights
    unstable: bool = False  # arch_unstable: 4 blocks, no residual connections
    unstable_layers: int = 4
    norm: bool = True  # arch_unnormalized: False removes every LayerNorm ...
    unnormalized_layers: int = 16  # ... from a stack this deep


# ----------------------------------------------------------------------------------------
# the model


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, with an optional key-padding mask."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v for all heads
        self.softmax = nn.Softmax(dim=-1)  # a module, so hooks see the attention weights
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        T = cfg.block_size
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))  # key j visible from query i
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        if pad is not None:  # pad: (B, T), True where the key is padding
            att = att.masked_fill(pad[:, None, None, :], float("-inf"))
        att = self.softmax(att)  # a row with every key masked is NaN: nan_softmax
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # (B, T, n_embd)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    """The transformer's position-wise feed-forward: 4x expansion, GELU."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-LN block: x + attn(ln(x)), then x + mlp(ln(x)) (residuals can be switched off)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.residual = cfg.residual and not cfg.unstable
        self.ln_1 = nn.LayerNorm(cfg.n_embd) if cfg.norm else nn.Identity()
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd) if cfg.norm else nn.Identity()
        self.mlp = MLPBlock(cfg)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        if self.residual:
            x = x + self.attn(self.ln_1(x), pad)
            return x + self.mlp(self.ln_2(x))
        x = self.attn(self.ln_1(x), pad)
        return self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token + position embeddings, ``n_layer`` blocks, final LN, tied LM head."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_layer = cfg.n_layer
        if cfg.unstable:
            n_layer = cfg.unstable_layers
        elif not cfg.norm:
            n_layer = cfg.unnormalized_layers
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd) if cfg.norm else nn.Identity()
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, cfg.init_std / math.sqrt(2 * n_layer))

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, self.cfg.init_std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        B, T = idx.shape  # (B, T) token ids
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, n_embd)
        for block in self.blocks:
            x = block(x, pad)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab) logits


# ----------------------------------------------------------------------------------------
# the data


class MarkovText:
    """A generated language: invented words, each followed by one of a few favourites.

    ``language`` picks the vocabulary and the chain; ``words`` (optional) fixes the first
    words of the vocabulary (LoRA's task B is a sub-language of task A's words with another
    chain); ``seed`` picks the sampled stream. Generated with numpy for speed (~10 ms).
    """

    def __init__(self, language: int, seed: int, n_words: int = 24, length: int = 20_000,
                 words: list[str] | None = None) -> None:
        g = np.random.default_rng(60_000 + language)
        letters = ALPHABET[1:-1]
        words = list(words or [])[:n_words]
        while len(words) < n_words:
            w = "".join(letters[i] for i in g.integers(len(letters), size=int(g.integers(2, 6))))
            if w not in words:
                words.append(w)
        # each word has 3 likely successors (80% of the mass) and a uniform tail
        succ = np.full((n_words, n_words), 0.2 / n_words)
        for i in range(n_words):
            succ[i, g.permutation(n_words)[:3]] += 0.8 / 3
        cum = np.cumsum(succ, axis=1)
        gs = np.random.default_rng(70_000 + 131 * language + seed)
        n_max = length // 2 + 1  # words are >= 2 chars plus a space
        u, stop = gs.random(n_max), gs.random(n_max) < 0.1
        w, out, size = 0, [], 0
        for i in range(n_max):
            w = min(int(np.searchsorted(cum[w], u[i] * cum[w, -1])), n_words - 1)
            out.append(words[w] + ("." if stop[i] else "") + " ")
            size += len(out[-1])
            if size >= length:
                break
        text = "".join(out)[:length]
        self.words = words
        lookup = {c: i for i, c in enumerate(ALPHABET)}
        self.data = torch.tensor([lookup[c] for c in text], dtype=torch.long)
        self.gen = torch.Generator().manual_seed(80_000 + 131 * language + seed)

    def batch(self, batch_size: int, block_size: int, gen: torch.Generator | None = None):
        """Random windows: inputs (B, T) and next-char targets (B, T)."""
        n = len(self.data) - block_size - 1
        ix = torch.randint(n, (batch_size,), generator=gen or self.gen)
        x = torch.stack([self.data[i : i + block_size] for i in ix.tolist()])
        y = torch.stack([self.data[i + 1 : i + 1 + block_size] for i in ix.tolist()])
        return x, y


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, pad: torch.Tensor | None = None):
    """Mean next-char cross-entropy; padded positions (target -1) are ignored."""
    logits = model(x, pad)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1)


def attention_entropy_hooks(model: nn.Module, store: list) -> list:
    """Forward hooks appending each softmax's mean attention entropy (nats) to ``store``."""

    def hook(mod, inp, out):
        if store is not None and getattr(mod, "_record", False):
            p = out.detach()
            store.append(-torch.special.xlogy(p, p).sum(-1).mean())

    return [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Softmax)]


# ----------------------------------------------------------------------------------------
# training


class TransformerTrainer(Trainer):
    """Next-char cross-entropy, AdamW, linear warm-up; logs attention entropy every 10 steps."""

    signal_every = 10

    def __init__(self, cfg: TransformerConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        self.text = MarkovText(cfg.text_seed_offset, seed)
        self.model = GPT(cfg)
        if cfg.qk_gain != 1.0:  # attention_collapse: only the query/key rows of c_attn
            with torch.no_grad():
                for block in self.model.blocks:
                    block.attn.c_attn.weight[: 2 * cfg.n_embd].mul_(cfg.qk_gain)
        scale_weights(self.model, cfg.init_gain)
        inj.apply_model(self.model, cfg, self)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay
        )
        self._entropies: list[torch.Tensor] = []
        self._hooks = attention_entropy_hooks(self.model, self._entropies)
        self._softmaxes = [m for m in self.model.modules() if isinstance(m, nn.Softmax)]

    def forward_backward(self, step: int) -> torch.Tensor:
        x, y = self.text.batch(self.cfg.batch_size, self.cfg.block_size)
        pad = torch.zeros_like(x, dtype=torch.bool)  # no padding in healthy batches
        x, y, pad = self.inj.apply_batch((x, y, pad), step)
        record = step % self.signal_every == 0
        for m in self._softmaxes:
            m._record = record
        self.inj.zero_grad(self.optimizer, step)
        loss = lm_loss(self.model, x, y, pad)
        loss.backward()
        return loss

    def optimizer_step(self, step: int) -> None:
        set_lr(self.optimizer, warmup_lr(self.cfg.lr, step, self.cfg.warmup))
        super().optimizer_step(step)

    def signals(self, step: int) -> dict:
        if not self._entropies:
            return {}
        ent = torch.stack(self._entropies).mean()
        self._entropies.clear()
        return {"attention_entropy": ent}


SPEC = register_arch(ArchSpec(
    name="transformer", family="transformer", config=TransformerConfig, trainer=TransformerTrainer,
    task="next-char prediction on a generated word-level Markov language (28 chars)",
    input_layer="wte", loop_layer="wpe", unstable_layer="blocks.0.ln_1", labels_at=1,
    symptoms={"init_too_large": "worse", "lr_too_high": "worse"},
    notes="arch_unstable: 4 blocks without residual connections (rank collapse, vanishing)",
))
register_general("transformer", ("healthy", "lr_too_high", "lr_too_low", "init_too_large",
                                 "arch_unstable", "labels_shuffled"))


# ----------------------------------------------------------------------------------------
# transformer-specific injections


def _permute_tokens(batch: tuple, step: int, inj: Injection) -> tuple:
    """From the onset on the text arrives through a different tokenizer (ids permuted)."""
    perm = torch.randperm(len(ALPHABET), generator=torch.Generator().manual_seed(1234))
    x, y, *rest = batch
    return (perm[x], torch.where(y >= 0, perm[y.clamp(min=0)], y), *rest)


def _empty_document(batch: tuple, step: int, inj: Injection) -> tuple:
    """One sequence of the batch is all padding (an empty document slipped through)."""
    x, y, pad = batch
    pad, y = pad.clone(), y.clone()
    pad[0] = True
    y[0] = -1  # its targets are ignored, as padding targets are
    return x, y, pad


TOKEN_ARCHS = ("transformer",)
TEXT_ARCHS = ("transformer", "lora")  # token-level data faults also apply to LoRA's task B

register_injection(Injection(
    name="data_shift", archs=TEXT_ARCHS, truth=("data", "shifted"), symptom="jump",
    onset_frac=ONSET_FRAC, layer_of="wte",
    description="from the onset on, the text arrives through a different tokenizer (ids permuted)",
    why="the input distribution changes mid-run; model and optimizer are untouched",
    batch=_permute_tokens,
))

register_injection(Injection(
    name="nan_softmax", archs=TEXT_ARCHS, truth=("data", "corrupted"), symptom="nonfinite",
    onset_frac=ONSET_FRAC, layer_of="blocks.0.attn.softmax", one_shot=True,
    description="an all-padding sequence at the onset: its key-padding mask masks every key, "
                "the softmax of an all -inf row is NaN",
    why="the model is healthy; a malformed (empty) sample in the batch makes the masked row",
    batch=_empty_document,
))

register_injection(Injection(
    name="attention_collapse", archs=TOKEN_ARCHS, truth=("initialization", "too_large"),
    symptom="attention_collapse", layer_of="blocks.0.attn.c_attn",
    description="query/key weights initialised 30x too large: attention logits are huge, every "
                "attention row is one-hot from step 0 (entropy -> 0) and the softmax stops "
                "passing gradient",
    why="only the initial scale of W_q and W_k changed; the collapse is there before any update",
    config=lambda c: replace(c, qk_gain=30.0),
))

register_injection(Injection(
    name="arch_unnormalized", archs=TOKEN_ARCHS, truth=("architecture", "unstable"), symptom="worse",
    layer_of="blocks.0.attn.c_attn",
    description="16 blocks with every LayerNorm (and the final one) removed: the residual stream "
                "grows block after block and the healthy learning rate destabilizes it",
    why="the same optimizer, schedule and init as the healthy run; only the architecture lost "
        "the normalization a deep pre-LN stack relies on",
    config=lambda c: replace(c, norm=False),
))

register_injection(Injection(
    name="no_warmup", archs=TOKEN_ARCHS, truth=("learning_rate", "too_high"), symptom="worse",
    description="peak LR 3x higher (3e-2, which trains fine with the 30-step warm-up) and the "
                "warm-up removed: the first Adam steps, taken with unreliable second-moment "
                "estimates, overshoot and the run never recovers the lost ground",
    why="with the warm-up the same peak LR trains well, so the fault is the learning rate "
        "being too high during the first steps",
    config=lambda c: replace(c, lr=3e-2, warmup=0),
))
