"""Seeded in-process data for the ecosystem archs: nothing is downloaded, ever.

Each maker owns a ``torch.Generator`` seeded from the run's seed, so a healthy run and an
injected run of the same seed draw the very same batches and differ only by the fault.
Every task is chosen to be learnable in ~100 steps of a tiny model on one CPU thread.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class MarkovTokens:
    """Sequences of a fixed sparse first-order Markov chain (the LM tasks).

    Every token has two likely successors (0.6 and 0.3) and 0.1 of uniform noise, so the
    loss falls from ``ln(vocab)`` (~4.2 nats) towards the chain's entropy (~1.3 nats) as a
    model learns the bigram table.
    """

    def __init__(self, seed: int, vocab: int = 64, seq_len: int = 32) -> None:
        g = torch.Generator().manual_seed(1_000 + seed)
        self.vocab, self.seq_len = vocab, seq_len
        trans = torch.full((vocab, vocab), 0.1 / vocab)
        succ = torch.stack([torch.randperm(vocab, generator=g)[:2] for _ in range(vocab)])
        rows = torch.arange(vocab)
        trans[rows, succ[:, 0]] += 0.6
        trans[rows, succ[:, 1]] += 0.3
        self.trans = trans / trans.sum(1, keepdim=True)
        self.gen = torch.Generator().manual_seed(2_000 + seed)

    def batch(self, n: int) -> torch.Tensor:
        """``n`` sequences of token ids, shape ``(n, seq_len)``."""
        x = torch.empty(n, self.seq_len, dtype=torch.long)
        x[:, 0] = torch.randint(0, self.vocab, (n,), generator=self.gen)
        for t in range(1, self.seq_len):
            x[:, t] = torch.multinomial(self.trans[x[:, t - 1]], 1, generator=self.gen).squeeze(1)
        return x


class KeywordTokens:
    """Bag-of-keywords sequence classification (the BERT / encoder tasks).

    Each class owns ``keywords`` token ids; a sequence mixes its class's keywords (30% of
    positions) into uniform filler tokens. Token 0 is kept as a [CLS]-like first token.
    """

    def __init__(self, seed: int, vocab: int = 64, seq_len: int = 24, n_classes: int = 4,
                 keywords: int = 6) -> None:
        g = torch.Generator().manual_seed(3_000 + seed)
        self.vocab, self.seq_len, self.n_classes = vocab, seq_len, n_classes
        perm = torch.randperm(vocab - 1, generator=g) + 1
        self.kw = perm[: n_classes * keywords].view(n_classes, keywords)
        self.filler = perm[n_classes * keywords:]
        self.gen = torch.Generator().manual_seed(4_000 + seed)

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids (n, seq_len), labels (n,))``."""
        y = torch.randint(0, self.n_classes, (n,), generator=self.gen)
        fill = self.filler[torch.randint(0, len(self.filler), (n, self.seq_len), generator=self.gen)]
        kw = self.kw[y[:, None], torch.randint(0, self.kw.shape[1], (n, self.seq_len), generator=self.gen)]
        use_kw = torch.rand(n, self.seq_len, generator=self.gen) < 0.3
        ids = torch.where(use_kw, kw, fill)
        ids[:, 0] = 0
        return ids, y


class TemplateImages:
    """Image classification: a smooth random template per class plus pixel noise (ViT)."""

    def __init__(self, seed: int, size: int = 16, channels: int = 3, n_classes: int = 4) -> None:
        g = torch.Generator().manual_seed(5_000 + seed)
        low = torch.randn(n_classes, channels, 4, 4, generator=g)
        self.templates = F.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
        self.n_classes = n_classes
        self.gen = torch.Generator().manual_seed(6_000 + seed)

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pixel_values (n, C, H, W), labels (n,))``."""
        y = torch.randint(0, self.n_classes, (n,), generator=self.gen)
        x = self.templates[y] + 0.7 * torch.randn(n, *self.templates.shape[1:], generator=self.gen)
        return x, y


class BlobImages:
    """Toy images in [-1, 1] for diffusion: one Gaussian blob of random place and width."""

    def __init__(self, seed: int, size: int = 8, channels: int = 1) -> None:
        self.size, self.channels = size, channels
        self.gen = torch.Generator().manual_seed(7_000 + seed)
        grid = torch.arange(size, dtype=torch.float32)
        self.yy, self.xx = torch.meshgrid(grid, grid, indexing="ij")

    def batch(self, n: int) -> torch.Tensor:
        """Images ``(n, C, size, size)``."""
        c = torch.rand(n, 2, generator=self.gen) * (self.size - 1)
        w = 0.8 + 1.5 * torch.rand(n, generator=self.gen)
        d2 = (self.yy - c[:, 0, None, None]) ** 2 + (self.xx - c[:, 1, None, None]) ** 2
        img = torch.exp(-d2 / (2 * w[:, None, None] ** 2)) * 2 - 1
        return img[:, None].expand(n, self.channels, self.size, self.size).contiguous()


class SineSequences:
    """Next-value forecasting of a two-tone sine with noise (the LSTM task)."""

    def __init__(self, seed: int, seq_len: int = 32) -> None:
        self.seq_len = seq_len
        self.gen = torch.Generator().manual_seed(8_000 + seed)

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs (n, T, 1), targets (n, T, 1))``: targets are inputs shifted by one."""
        t = torch.arange(self.seq_len + 1, dtype=torch.float32)
        f = 0.15 + 0.35 * torch.rand(n, 2, 1, generator=self.gen)
        ph = 2 * math.pi * torch.rand(n, 2, 1, generator=self.gen)
        s = torch.sin(f * t + ph).sum(1) / 2 + 0.05 * torch.randn(n, self.seq_len + 1, generator=self.gen)
        s = s[..., None]
        return s[:, :-1].contiguous(), s[:, 1:].contiguous()


class TabularRows:
    """Tabular classification: z-scored numeric columns (as a ``StandardScaler`` leaves them),
    the class given by a fixed random linear rule of the first ``informative`` ones plus noise."""

    def __init__(self, seed: int, features: int = 12, informative: int = 6, n_classes: int = 3) -> None:
        g = torch.Generator().manual_seed(9_000 + seed)
        self.features = features
        self.rule = torch.zeros(features, n_classes)
        self.rule[:informative] = torch.randn(informative, n_classes, generator=g)
        self.gen = torch.Generator().manual_seed(9_500 + seed)

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows (n, features), labels (n,))``."""
        x = torch.randn(n, self.features, generator=self.gen)
        logits = x @ self.rule + 0.3 * torch.randn(n, self.rule.shape[1], generator=self.gen)
        return x, logits.argmax(1)
