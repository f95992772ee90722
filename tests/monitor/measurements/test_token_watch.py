"""The token-input watch end to end: a tiny language model whose vocabulary is remapped mid-run."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.monitor.measurements.tokens import TokenWatch

VOCAB, T = 24, 16


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 16)
        self.wpe = nn.Embedding(T, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        return self.head(torch.tanh(self.wte(ids) + self.wpe(pos)))  # (B, T, VOCAB)


def train(seed, remap_at=None, steps=60, every=1):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    freq = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64)  # Zipf-like token frequencies
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(7))
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with NeuralDbg(model, optimizer=opt, every=every) as dbg:
        for step in range(steps):
            dbg.step = step
            ids = torch.multinomial(freq, 32 * T, replacement=True, generator=g).view(32, T)
            if remap_at is not None and step >= remap_at:
                ids = perm[ids]
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def shifts(dbg):
    return [e for e in dbg.events if e.kind == "shift"]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_stationary_token_stream_is_watched_and_quiet(seed):
    dbg = train(seed)
    assert shifts(dbg) == []
    assert dbg.signatures().as_dict()["token_watched"] == 2  # wte and the position embedding
    from neuraldbg.causal.evidence import extract

    assert extract(dbg.trace()).observed["data_shift"] == "absent"


@pytest.mark.parametrize("seed", [0, 1])
def test_a_vocabulary_remap_is_an_input_shift_at_the_embedding(seed):
    dbg = train(seed, remap_at=36)
    (ev,) = shifts(dbg)
    assert ev.layer == "wte" and ev.step == 36 and ev.measured["at_input"] == 1.0
    from neuraldbg.causal.evidence import extract

    assert extract(dbg.trace()).observed["data_shift"] == "input"


def test_unchecked_steps_record_no_histogram():
    dbg = train(0, steps=20, every=5)
    watch = dbg.addon(TokenWatch)
    assert watch._pending == {} and not watch._handles  # flushed and unhooked on exit
    assert sum(d._seen for d in watch._detectors.values()) == 2 * 4  # steps 0, 5, 10, 15


def test_the_watch_does_not_change_training():
    a, b = TinyLM(), TinyLM()
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, VOCAB, (8, T), generator=torch.Generator().manual_seed(3))
    for model, monitored in ((a, False), (b, True)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ctx = NeuralDbg(model, optimizer=opt) if monitored else None
        if ctx:
            ctx.__enter__()
        for _ in range(5):
            loss = model(ids).logsumexp(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if ctx:
                ctx.record_loss(loss)
        if ctx:
            ctx.__exit__(None, None, None)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.slow
def test_a_compiled_model_keeps_one_graph():
    """The watch's bookkeeping must neither break nor recompile a ``torch.compile`` graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        compiled = torch.compile(model)
        for step in range(6):
            dbg.step = step
            loss = compiled(torch.randint(0, VOCAB, (4, T))).logsumexp(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 1
