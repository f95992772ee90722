"""Real tiny runs where only the warm-up signature tells a too-high learning rate: a deep
post-norm encoder trained at its peak rate from the first step stalls at chance, and the
schedule read from ``param_groups`` is the one reading that points at the learning rate
(the step size, read at the peak, is normal). Each run trains for about a second."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.causal import api

VOCAB, SEQ, CLASSES, STEPS = 16, 8, 4, 100


class Encoder(nn.Module):
    """Embedding -> ``nn.TransformerEncoder`` (post-norm unless ``norm_first``) -> mean -> head."""

    def __init__(self, layers=8, d=16, norm_first=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        block = nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, CLASSES)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(1))


def run(seed, *, lr=3e-2, warmup=0, norm_first=False):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = Encoder(norm_first=norm_first)
    opt = torch.optim.Adam(model.parameters(), lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    losses = []
    with NeuralDbg(model) as dbg:  # the optimizer is found, not given
        for _ in range(STEPS):
            ids = torch.randint(0, VOCAB, (32, SEQ), generator=gen)
            y = F.one_hot(ids % CLASSES, CLASSES).sum(1).argmax(1)  # the most frequent residue class
            loss = F.cross_entropy(model(ids), y)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            sched.step()
            losses.append(loss.item())
    return dbg, losses


def _odds(p):
    return p / (1 - p)


def p_too_high(trace, drop=()):
    net = api.compiled(api.resolve_priors(trace))
    ev = {k: v for k, v in api.evidence(trace).observed.items() if k not in drop}
    return net.posterior(ev)[0]["learning_rate"]["too_high"]


@pytest.mark.parametrize("seed", [0, 1])
def test_no_warm_up_on_a_deep_post_norm_stack_points_at_the_learning_rate(seed):
    dbg, losses = run(seed)
    tail = sum(losses[-25:]) / 25
    assert abs(tail - math.log(CLASSES)) < 0.05  # stalled at chance
    tr = dbg.trace()
    ev = api.evidence(tr).observed
    assert ev["warmup"] == "absent" and ev["step_size"] == "normal"
    with_it, without = p_too_high(tr), p_too_high(tr, drop=("warmup",))
    # the warm-up reading alone moves it: a likelihood ratio of its own, whatever else the run
    # shows (on some CPUs' kernels seed 1 also explodes later, evidence for too_high of its own,
    # so the posterior without the reading is not near 0 on every machine). How high it ends
    # depends on the family's fitted priors: the zoo's transformer arch_unstable (4 blocks
    # without residuals) stalls with the same vanishing gradients and collapsed output, and
    # under the priors refitted at the default cadence seed 0 ranks architecture/unstable
    # (0.41) above the rate (0.31): a known weakness of the zoo-fitted priors, which the
    # warm-up reading alone does not overturn
    assert _odds(with_it) > 20 * _odds(without)
    hs = dbg.get_causal_hypotheses()
    top = [h for h in hs if (h.cause, h.state) == ("learning_rate", "too_high")]
    assert top and top[0].suggested_fix.startswith("Add warm-up")


def test_the_same_schedule_on_a_pre_norm_stack_is_no_evidence_and_stays_quiet():
    dbg, losses = run(0, norm_first=True)
    assert sum(losses[-25:]) / 25 < 0.5 * math.log(CLASSES)  # learns
    tr = dbg.trace()
    ev = api.evidence(tr)
    assert "warmup" not in ev.observed and "post-norm" in ev.unobserved["warmup"]
    assert dbg.get_causal_hypotheses() == []


def test_a_deep_post_norm_stack_with_its_warm_up_reads_it_present():
    dbg, _ = run(0, lr=1e-2, warmup=10)
    assert api.evidence(dbg.trace()).observed["warmup"] == "present"
    assert dbg.get_causal_hypotheses() == []
