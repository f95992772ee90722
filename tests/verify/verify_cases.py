"""Small runs for the verification tests: one loop, one replay, faults switched on by argument.

``train(...)`` trains a 3-layer MLP on a seeded teacher task with ``NeuralDbg(...,
snapshots=True)`` and returns ``(model, optimizer, dbg, replay)``; ``replay(model, optimizer,
step)`` takes step ``step`` on the same batch as the run did (batches are a pure function of
the step), which is what ``dbg.verify`` needs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.faults import corrupt_rows, rescale, scale_weights

IN, HIDDEN, CLASSES, BATCH = 16, 64, 4, 64


def _batches(steps: int, seed: int, nan_at: int | None, shift_at: int | None):
    g = torch.Generator().manual_seed(1000 + seed)
    teacher = torch.randn(IN, CLASSES, generator=g)
    xs = torch.randn(steps, BATCH, IN, generator=g)
    ys = (torch.tanh(xs) @ teacher).argmax(-1)
    if nan_at is not None:
        xs[nan_at] = corrupt_rows(xs[nan_at], math.nan)
    if shift_at is not None:
        xs[shift_at:] = rescale(xs[shift_at:])
    return xs, ys


def train(*, steps: int = 60, lr: float = 0.05, first_gain: float = 1.0, gain: float = 1.0,
          nan_at: int | None = None, shift_at: int | None = None, depth: int = 2, act: type = nn.ReLU,
          seed: int = 0, snapshots=True, adam: bool = False, priors: str | None = None):
    """A monitored run; ``first_gain`` scales the first layer's weights only, ``gain`` every
    layer's; ``nan_at`` puts NaN in a quarter of one batch, ``shift_at`` multiplies inputs by
    1000 from that step on."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    dims = [IN] + [HIDDEN] * depth
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), act()]
    model = nn.Sequential(*layers, nn.Linear(HIDDEN, CLASSES))
    scale_weights(model, gain)
    scale_weights(model[0], first_gain)
    opt = (torch.optim.Adam(model.parameters(), lr=lr) if adam
           else torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    xs, ys = _batches(steps, seed, nan_at, shift_at)
    return _monitored(model, opt, steps, lambda m, step: F.cross_entropy(m(xs[step]), ys[step]),
                      snapshots=snapshots, priors=priors)


def _monitored(model, opt, steps: int, loss_of, **kwargs):
    """Train ``steps`` steps of ``loss_of(model, step)`` under ``NeuralDbg(**kwargs)``; return
    ``(model, opt, dbg, replay)``."""
    def forward_backward(model, step):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, step)
        loss.backward()
        return loss

    def replay(model, optimizer, step):
        loss = forward_backward(model, step)
        optimizer.step()
        return loss

    with NeuralDbg(model, optimizer=opt, **kwargs) as dbg:
        for step in range(steps):
            dbg.step = step
            loss = forward_backward(model, step)
            dbg.record_loss(loss)
            opt.step()
    return model, opt, dbg, replay


def finetune(*, lr: float, seed: int = 0, steps: int = 60, reference: bool = True, conflict: float = 0.7):
    """A model pre-trained on teacher A (300 Adam steps, unmonitored), then fine-tuned with
    Adam at ``lr`` on teacher B = A + ``conflict`` x another teacher under ``NeuralDbg(...,
    snapshots=True, reference=...)``, the reference being A's loss on a held-out batch.
    With the related B (0.7), 1e-3 keeps most of A; a B dominated by the other teacher (3.0)
    overwrites A at any rate that learns it. Returns
    ``(model, opt, dbg, replay)``."""
    g = torch.Generator().manual_seed(2000 + seed)
    teacher_a = torch.randn(IN, CLASSES * 2, generator=g)
    teacher_b = teacher_a + conflict * torch.randn(IN, CLASSES * 2, generator=g)
    xa = torch.randn(512, IN, generator=g)
    ya = (torch.tanh(xa) @ teacher_a).argmax(-1)
    pre_x = torch.randn(300, BATCH, IN, generator=g)
    pre_y = (torch.tanh(pre_x) @ teacher_a).argmax(-1)
    xs = torch.randn(steps, BATCH, IN, generator=g)
    ys = (torch.tanh(xs) @ teacher_b).argmax(-1)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES * 2))
    pre = torch.optim.Adam(model.parameters(), lr=3e-3)
    for x, y in zip(pre_x, pre_y):
        pre.zero_grad()
        F.cross_entropy(model(x), y).backward()
        pre.step()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ref = (lambda m: F.cross_entropy(m(xa), ya)) if reference else None
    return _monitored(model, opt, steps, lambda m, step: F.cross_entropy(m(xs[step]), ys[step]),
                      snapshots=True, reference=ref, reference_every=5)


def blind_priors(path, family: str = "mlp", keep: tuple[str, ...] = ("loss_pattern",)) -> str:
    """A prior file where only the evidence variables in ``keep`` carry information (every
    other evidence table is flat): a network that sees the loss blow up but neither the root
    causes' signatures nor when the blow-up began, so a learning-rate blow-up and an init
    blow-up look alike. Returns the path."""
    import json

    from neuraldbg.causal.priors import load_priors
    from neuraldbg.causal.structure import default_network

    net = default_network()
    data = load_priors(family=family).to_dict()
    cpds = dict(data.get("cpds") or {})
    for name in net.evidence_names:
        if name in keep:
            continue
        parents = list(net.parents_of(name))
        states = list(net.states_of(name))
        cols = math.prod(len(net.states_of(p)) for p in parents)
        cpds[name] = {"parents": parents, "states": states, "values": [[1 / len(states)] * cols for _ in states]}
    data["cpds"] = cpds
    with open(path, "w") as f:
        json.dump(data, f)
    return str(path)


class TinyAttention(nn.Module):
    """One causal single-head attention layer with an ``nn.Softmax`` on next-token prediction."""

    def __init__(self, vocab: int, dim: int, context: int) -> None:
        super().__init__()
        self.dim = dim
        self.wte = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.softmax = nn.Softmax(dim=-1)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)                                       # (B, T, D)
        q, k, v = self.qkv(x).split(self.dim, dim=-1)
        att = (q @ k.transpose(-1, -2)) / self.dim ** 0.5       # (B, T, T)
        att = self.softmax(att.masked_fill(~self.mask, float("-inf")))
        return self.head(x + att @ v)                           # (B, T, vocab)


def train_attention(*, qk_gain: float = 1.0, steps: int = 40, seed: int = 0):
    """A monitored :class:`TinyAttention` run on a seeded Markov chain of 64 tokens, its query
    and key weights scaled by ``qk_gain`` at init (attention collapse). Returns ``(model,
    optimizer, dbg, replay)`` like :func:`train`."""
    vocab, dim, context, batch = 64, 32, 16, 32
    torch.manual_seed(seed)
    model = TinyAttention(vocab, dim, context)
    with torch.no_grad():
        model.qkv.weight[: 2 * dim].mul_(qk_gain)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(2000 + seed)
    chain = torch.randint(0, vocab, (vocab,), generator=g)
    seq = [torch.randint(0, vocab, (steps, batch, 1), generator=g)]
    for _ in range(context):
        seq.append(chain[seq[-1]])
    data = torch.cat(seq, -1)                                   # (steps, B, T + 1)

    def loss_of(model, step):
        logits = model(data[step, :, :-1])
        return F.cross_entropy(logits.reshape(-1, vocab), data[step, :, 1:].reshape(-1))

    return _monitored(model, opt, steps, loss_of, snapshots=True)
