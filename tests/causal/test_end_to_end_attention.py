"""End to end: query/key weights initialized far too large make every attention row one-hot
before the first update (``saturation = init_softmax``), which reads as weights too large; the
same model at the default scale stays healthy."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal import api

STEPS, T, D, VOCAB = 60, 16, 32, 24


class TinyAttention(nn.Module):
    """One causal self-attention block with its softmax as a module (as nanoGPT-style code
    writes it), a ReLU MLP and a next-token head."""

    def __init__(self, qk_gain: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.norm = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.softmax = nn.Softmax(dim=-1)
        self.proj = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.ReLU(), nn.Linear(2 * D, D))
        self.head = nn.Linear(D, VOCAB)
        with torch.no_grad():
            self.qkv.weight[: 2 * D].mul_(qk_gain)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        q, k, v = self.qkv(self.norm(x)).split(D, dim=-1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = self.softmax(att.masked_fill(~self.mask, float("-inf")))
        x = x + self.proj(att @ v)
        return self.head(x + self.mlp(x))


def run(qk_gain: float, seed: int = 0) -> NeuralDbg:
    torch.manual_seed(seed)
    model = TinyAttention(qk_gain)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    with NeuralDbg(model, family="transformer") as dbg:
        for _ in range(STEPS):
            start = torch.randint(0, VOCAB, (16, 1), generator=gen)
            seq = (start + torch.arange(T + 1)) % VOCAB  # a counting sequence: learnable from the last token
            logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_query_key_weights_30x_too_large_read_as_initialization_too_large(seed):
    dbg = run(30.0, seed)
    ev = api.evidence(dbg.trace())
    assert ev.observed["saturation"] == "init_softmax"
    h = dbg.get_causal_hypotheses()[0]
    assert (h.cause, h.state) == ("initialization", "too_large")
    assert "query and key projections" in h.suggested_fix


def test_the_same_attention_at_the_default_scale_stays_healthy():
    dbg = run(1.0)
    ev = api.evidence(dbg.trace())
    assert ev.observed["saturation"] == "absent"
    assert api.posterior(dbg.trace()).p_healthy >= 0.5
