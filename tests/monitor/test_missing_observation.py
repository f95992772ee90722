"""No observation is not zero: an empty batch, a branch that does not run and an expert that
gets no tokens are missing for that step. No event, a healthy diagnosis, training unchanged."""
import pytest
import torch
from torch import nn

from tests.tiny import batches, run, spy_steps

STEPS = 60


class Branchy(nn.Module):
    """An MLP whose ``branch`` runs on even steps only (``self.step`` set by the loop)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.act = nn.ReLU()
        self.branch = nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.out = nn.Linear(32, 3)
        self.step = 0

    def forward(self, x):
        h = self.act(self.inp(x))
        if self.step % 2 == 0:
            h = h + self.branch(h)
        return self.out(h)


class TinyMoE(nn.Module):
    """Top-1 routing over 4 experts; on odd steps expert 3 is masked out of the router, so it
    runs on zero tokens (an empty input, an empty output, zero gradients)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.router = nn.Linear(16, 4)
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.out = nn.Linear(16, 3)
        self.step = 0

    def forward(self, x):
        h = torch.relu(self.inp(x))
        logits = self.router(h)
        if self.step % 2 == 1:
            logits = logits.masked_fill(torch.arange(4) == 3, float("-inf"))
        gate = logits.softmax(dim=-1)
        choice = gate.argmax(dim=-1)
        mixed = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows = (choice == e).nonzero().flatten()
            mixed = mixed.index_add(0, rows, expert(h[rows]) * gate[rows, e:e + 1])
        return self.out(h + mixed)


def mlp():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def train(make, monitor, *, empty_at=(), every=1):
    """A learnable task (the class is the largest of 3 inputs); ``empty_at``: steps whose batch
    has zero rows (a mean loss over nothing is NaN). Returns (losses, params, dbg)."""
    torch.manual_seed(0)
    model = make()

    def set_step(step):
        model.step = step

    r = run(model, steps=STEPS, data=batches(STEPS, empty_at=empty_at), optimizer=torch.optim.Adam, lr=1e-2,
            monitor={"optimizer": True, "every": every} if monitor else None, before_step=set_step)
    return r.losses, r.params, r.dbg


def assert_unchanged_and_healthy(make, **kw):
    l1, p1, _ = train(make, False, **kw)
    l2, p2, dbg = train(make, True, **kw)
    assert all(torch.equal(a, b) or (a.isnan() and b.isnan()) for a, b in zip(l1, l2))
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))
    assert dbg.events == []
    hyps = dbg.get_causal_hypotheses()
    post = dbg.posterior()
    assert not hyps or post.p_healthy > max(h.probability for h in hyps)
    return dbg


@pytest.mark.parametrize("every", [1, 4])  # step 30 checked, then unchecked
def test_an_empty_batch_is_missing_not_a_failure(every):
    dbg = assert_unchanged_and_healthy(mlp, empty_at=(30,), every=every)
    tr = dbg.trace()
    assert tr.loss.n == STEPS - 1 and tr.loss.n_nonfinite == 0  # its NaN loss is no observation


def test_a_branch_that_does_not_run_is_missing():
    dbg = assert_unchanged_and_healthy(Branchy)
    assert "branch.0" in {layer.name for layer in dbg.layers()}


def test_an_expert_without_tokens_is_missing():
    assert_unchanged_and_healthy(TinyMoE)


def test_missing_layers_are_nan_in_the_columns_and_absent_from_the_dict(monkeypatch):

    seen = spy_steps(monkeypatch)
    train(TinyMoE, True)
    odd = [st for st in seen if st.step % 2 == 1 and st.has_backward]
    i = odd[0].names.index("experts.3")
    for st in odd:
        assert "experts.3" not in st.layers  # neither its empty output nor its zero gradients
        assert not st.has_out[i] and not st.has_pgrad[i] and st.cols["pgrad_sumsq"][i] != st.cols["pgrad_sumsq"][i]
    even = [st for st in seen if st.step % 2 == 0 and st.has_backward]
    assert any("experts.3" in st.layers for st in even)
