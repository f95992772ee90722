"""The loop checks end to end (``neuraldbg/monitor/measurements/loop.py``): each bug reads its
``training_loop`` state as the top hypothesis, the controls that look like it stay quiet, and
the global optimizer hooks neither change training nor outlive the monitor.

Tiny real training, without ``optimizer=`` (the monitor finds the optimizers through torch's
global step hooks) unless a case says otherwise. Every healthy control must also learn, so
the progress node has no reason to doubt it.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import optimizer as O

from neuraldbg import NeuralDbg
from neuraldbg.causal.nodes.loop import (DETACHED_LAYER, DETACHED_PARAMS, ORPHAN_LAYER, ORPHAN_PARAMS,
                                         PROB_SHARE_SIG, STALE_CHECKED, STALE_STEPS)
from neuraldbg.monitor.measurements.loop import ROW_TOL, row_tolerance
from tests.tiny import run

LOOP_STATES = ("stale_gradients", "params_not_in_optimizer", "graph_detached", "loss_on_probabilities")


def data(steps, n=32, d=8, classes=3, seed=0):
    """A learnable task: the class is the largest of the first ``classes`` inputs."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        x = torch.randn(n, d, generator=gen)
        out.append((x, x[:, :classes].argmax(1)))
    return out


def mlp(last=None, hidden=32):
    torch.manual_seed(0)
    layers = [nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3)]
    return nn.Sequential(*layers, *([last] if last is not None else []))


class Split(nn.Module):
    """Features, a head, and a branch that never runs; ``cut`` severs the features from the loss."""

    def __init__(self, cut=None):
        super().__init__()
        torch.manual_seed(0)
        self.cut = cut
        self.features = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.unused = nn.Linear(32, 3)

    def forward(self, x):
        if self.cut == "no_grad":
            with torch.no_grad():
                h = self.features(x)
        else:
            h = self.features(x)
            h = h.detach() if self.cut == "detach" else h
        return self.head(h)


def train(model, opt=None, steps=60, *, params=None, lr=1e-2, opt_cls=torch.optim.Adam, explicit=False,
          zero="optimizer", accumulate=1, loss_fn=F.cross_entropy, **monitor):
    """A classic loop; ``zero``: "optimizer", "model", "keep" (set_to_none=False) or None (never);
    ``accumulate``: backward passes per step (zero_grad after the step). Returns the monitor."""
    opt = opt if opt is not None else opt_cls(model.parameters() if params is None else params, lr=lr)
    with NeuralDbg(model, optimizer=opt if explicit else None, **monitor) as dbg:
        for i, (x, y) in enumerate(data(steps * accumulate)):
            if zero == "model" and i % accumulate == 0:
                model.zero_grad()  # before the backward, through the model
            loss = loss_fn(model(x), y)
            (loss / accumulate).backward()
            dbg.record_loss(loss)
            if (i + 1) % accumulate == 0:
                opt.step()
                if zero == "optimizer":
                    opt.zero_grad()
                elif zero == "keep":
                    opt.zero_grad(set_to_none=False)
    return dbg


def assert_bug(dbg, state):
    """``training_loop=state`` is the top hypothesis, above one half; the run is not healthy."""
    post = dbg.posterior()
    hyps = dbg.get_causal_hypotheses()
    assert hyps, post
    assert (hyps[0].cause, hyps[0].state) == ("training_loop", state), (hyps[0], post)
    assert post["training_loop"][state] >= 0.5 and not post.is_healthy
    return post


def assert_quiet(dbg, learns=True):
    """Healthy, no loop state at one half, and (``learns``) the progress node reads learning."""
    post = dbg.posterior()
    assert post.is_healthy, post
    assert max(post["training_loop"][s] for s in LOOP_STATES) < 0.5, post
    if learns:
        assert post.evidence.get("progress") == "learning", post.evidence
    return post


def sig(dbg, s):
    return dbg.trace().signatures.value(s)


# ---- the bugs -----------------------------------------------------------------------------


@pytest.mark.parametrize("opt_cls,lr", [(torch.optim.SGD, 0.05), (torch.optim.Adam, 1e-2)])
@pytest.mark.parametrize("explicit", [False, True])
def test_zero_grad_never_called_reads_stale_gradients(opt_cls, lr, explicit):
    dbg = train(mlp(), opt_cls=opt_cls, lr=lr, zero=None, explicit=explicit)
    assert_bug(dbg, "stale_gradients")
    # exact: every examined step after the first ran on the previous steps' gradients
    assert sig(dbg, STALE_STEPS) == sig(dbg, STALE_CHECKED) - 1 == 15


def test_optimizer_on_part_of_the_model_reads_params_not_in_optimizer():
    m = mlp()
    dbg = train(m, params=m[2].parameters())
    assert_bug(dbg, "params_not_in_optimizer")
    assert sig(dbg, ORPHAN_PARAMS) == 2 and sig(dbg, ORPHAN_LAYER) == "0"  # the first layer's weight and bias


@pytest.mark.parametrize("explicit", [False, True])
def test_head_replaced_after_the_optimizer_was_built(explicit):
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m[2] = nn.Linear(32, 3)  # the optimizer still holds the old head
    dbg = train(m, opt, explicit=explicit)
    assert_bug(dbg, "params_not_in_optimizer")
    assert sig(dbg, ORPHAN_PARAMS) == 2 and sig(dbg, ORPHAN_LAYER) == "2"


@pytest.mark.parametrize("at", [0, 20])
def test_head_replaced_inside_the_monitored_loop(at):
    """Regression, missed bug: the parameters were mapped on entry only, so a head swapped in
    inside the ``with`` block (the optimizer still on the old one) was never seen, at step 0 or
    after the first window; the window now walks the model as it is and opens again when the
    monitor notices the new module."""
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    with NeuralDbg(m) as dbg:
        for i, (x, y) in enumerate(data(80)):
            if i == at:
                m[2] = nn.Linear(32, 3)
            loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert_bug(dbg, "params_not_in_optimizer")
    assert sig(dbg, ORPHAN_LAYER) == "2"


@pytest.mark.parametrize("cut", ["no_grad", "detach"])
@pytest.mark.parametrize("explicit", [False, True])
def test_features_cut_from_the_loss_read_graph_detached(cut, explicit):
    dbg = train(Split(cut), explicit=explicit)
    assert_bug(dbg, "graph_detached")
    assert sig(dbg, DETACHED_PARAMS) == 2 and sig(dbg, DETACHED_LAYER) == "features.0"


class Emb(nn.Module):
    def __init__(self, detach):
        super().__init__()
        torch.manual_seed(0)
        self.detach, self.emb, self.head = detach, nn.Embedding(10, 16), nn.Linear(16, 10)

    def forward(self, t):
        e = self.emb(t)
        return self.head(e.detach() if self.detach else e)


@pytest.mark.parametrize("detach", [True, False])
def test_detached_embedding(detach):
    m = Emb(detach)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    with NeuralDbg(m) as dbg:
        for _ in range(60):
            t = torch.randint(0, 10, (32,), generator=gen)
            loss = F.cross_entropy(m(t), (t + 1) % 10)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    if detach:
        assert_bug(dbg, "graph_detached")
        assert sig(dbg, DETACHED_LAYER) == "emb"
    else:
        assert_quiet(dbg)


@pytest.mark.parametrize("explicit", [False, True])
def test_softmax_before_cross_entropy_reads_loss_on_probabilities(explicit):
    dbg = train(mlp(last=nn.Softmax(-1)), explicit=explicit)
    assert_bug(dbg, "loss_on_probabilities")
    assert sig(dbg, PROB_SHARE_SIG) == 1.0


def test_softmax_under_bf16_autocast_was_read_as_logits():
    """Regression: rows of a bf16 softmax sum to 1 only within bf16 rounding (~4e-3), above the
    float32 tolerance, so a softmax in front of the loss under autocast read "logits" (the
    ecosystem suite's bf16 seeds, P(healthy) 0.99)."""
    model = mlp(last=nn.Softmax(-1)).to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with NeuralDbg(model) as dbg:
        for x, y in data(40):
            loss = F.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            opt.zero_grad()
    assert sig(dbg, PROB_SHARE_SIG) == 1.0
    assert_bug(dbg, "loss_on_probabilities")


def test_row_tolerance_follows_the_dtype():
    assert row_tolerance(torch.float32) == ROW_TOL  # float32 rounding is far inside it
    assert row_tolerance(torch.bfloat16) == 2 ** -7 and row_tolerance(torch.float16) == ROW_TOL  # eps 2**-10
    assert row_tolerance(torch.int64) == ROW_TOL


# ---- the controls -------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 4])
def test_gradient_accumulation_is_quiet(k):
    dbg = train(mlp(), steps=60, accumulate=k, every=1)  # every step: the stale window fills
    assert_quiet(dbg)
    assert sig(dbg, STALE_STEPS) == 0 and sig(dbg, STALE_CHECKED) == 16


@pytest.mark.parametrize("k", [2, 4])
def test_gradient_accumulation_recording_once_per_update_is_quiet(k):
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    with NeuralDbg(m) as dbg:
        batches = data(60 * k)
        for i in range(0, len(batches), k):
            total = 0.0
            for x, y in batches[i:i + k]:
                loss = F.cross_entropy(m(x), y) / k
                loss.backward()
                total = total + loss.detach()
            opt.step()
            opt.zero_grad()
            dbg.record_loss(total)
    assert_quiet(dbg)
    assert sig(dbg, STALE_STEPS) == 0


def test_frozen_backbone_with_a_head_only_optimizer_is_quiet():
    m = mlp(hidden=64)
    m[0].requires_grad_(False)
    assert_quiet(train(m, params=m[2].parameters(), lr=3e-2))


def test_backbone_under_no_grad_outside_the_optimizer_is_quiet():
    # feature extraction: the backbone still requires grad, runs under no_grad, and no optimizer holds it
    m = Split("no_grad")
    assert_quiet(train(m, params=m.head.parameters(), lr=3e-2))


def test_a_branch_that_never_runs_is_quiet():
    dbg = train(Split())
    assert_quiet(dbg)
    assert sig(dbg, DETACHED_PARAMS) == 0


def test_new_head_with_its_own_optimizer_mid_run_is_quiet():
    """Phase two of a fine-tune: the backbone frozen, a new head and an optimizer made for it
    alone (it holds none of the parameters the monitor read on entry). Regression, missed
    optimizer: the watch read the model's parameters on entry only, so that optimizer was never
    found and none of its steps were measured; it now reads them again when the monitor notices
    the new module."""
    m = mlp(hidden=64)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    with NeuralDbg(m) as dbg:
        for i, (x, y) in enumerate(data(100)):
            if i == 30:
                m[0].requires_grad_(False)
                m[2] = nn.Linear(64, 3)
                opt = torch.optim.Adam(m[2].parameters(), lr=3e-2)
            loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert_quiet(dbg)
    assert any(o is opt for o in dbg._optimizers.found)  # found after the monitor noticed the new head


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
        self.D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


@pytest.mark.parametrize("explicit", [False, True])
def test_gan_with_the_fake_detached_for_the_discriminator_is_quiet(explicit):
    m = GAN()
    opt_g = torch.optim.Adam(m.G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(m.D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    gen = torch.Generator().manual_seed(0)
    ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
    with NeuralDbg(m, optimizer=opt_g if explicit else None) as dbg:
        for _ in range(80):
            real = torch.randn(32, 2, generator=gen) * 0.5 + torch.tensor([2.0, -1.0])
            fake = m.G(torch.randn(32, 4, generator=gen))
            opt_d.zero_grad()
            d_loss = (F.binary_cross_entropy_with_logits(m.D(real), ones)
                      + F.binary_cross_entropy_with_logits(m.D(fake.detach()), zeros))
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()  # D's gradients from this backward are zeroed before D's next step
            g_loss = F.binary_cross_entropy_with_logits(m.D(fake), ones)
            g_loss.backward()
            opt_g.step()
            dbg.record_loss(d_loss + g_loss)
    assert dbg.family == "gan" and len(dbg._optimizers.found) == 2
    assert_quiet(dbg, learns=False)  # a game: its progress is no evidence
    assert sig(dbg, STALE_STEPS) == 0 and sig(dbg, DETACHED_PARAMS) == 0 and sig(dbg, ORPHAN_PARAMS) == 0


class Agent(nn.Module):
    def __init__(self, frozen):
        super().__init__()
        torch.manual_seed(0)
        self.q = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        self.target = copy.deepcopy(self.q)
        self.target.requires_grad_(not frozen)


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize("how", ["no_grad", "detach"])
def test_dqn_target_network_outside_the_optimizer_is_quiet(frozen, how):
    m = Agent(frozen)
    opt = torch.optim.Adam(m.q.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, generator=gen)
    with NeuralDbg(m) as dbg:
        for i in range(150):
            s, s2 = torch.randn(32, 8, generator=gen), torch.randn(32, 8, generator=gen)
            a = torch.randint(0, 4, (32,), generator=gen)
            r = (s @ w).gather(1, a[:, None]).squeeze(1)
            if how == "no_grad":
                with torch.no_grad():
                    target = r + 0.5 * m.target(s2).max(1).values
            else:
                target = (r + 0.5 * m.target(s2).max(1).values).detach()
            loss = F.smooth_l1_loss(m.q(s).gather(1, a[:, None]).squeeze(1), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
            if i % 20 == 19:
                m.target.load_state_dict(m.q.state_dict())
    assert_quiet(dbg)
    assert sig(dbg, DETACHED_PARAMS) == 0 and sig(dbg, ORPHAN_PARAMS) == 0


def test_regression_needs_no_softmax_and_is_quiet():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    with NeuralDbg(m) as dbg:
        for x, _ in data(60):
            loss = F.mse_loss(m(x), x @ w)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert_quiet(dbg)
    assert sig(dbg, PROB_SHARE_SIG) == 0.0


def test_softmax_with_nll_on_its_log_is_quiet():
    # probabilities out, but the loss takes their log: it reaches below ln(1 + (K-1)/e)
    m = mlp(last=nn.Softmax(-1))
    dbg = train(m, loss_fn=lambda p, y: F.nll_loss(torch.log(p + 1e-9), y))
    assert_quiet(dbg)
    assert sig(dbg, PROB_SHARE_SIG) == 1.0


@pytest.mark.parametrize("zero", ["keep", "model"])
def test_zero_grad_variants_are_quiet(zero):
    # zero_grad(set_to_none=False) after the step; model.zero_grad() before the backward
    dbg = train(mlp(), zero=zero)
    assert_quiet(dbg)
    assert sig(dbg, STALE_STEPS) == 0


def test_optimizer_zero_grad_before_backward_is_quiet():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    with NeuralDbg(m) as dbg:
        for x, y in data(60):
            loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert_quiet(dbg)
    assert sig(dbg, STALE_STEPS) == 0


# ---- the global optimizer hooks -----------------------------------------------------------


def _momentum(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


@pytest.mark.parametrize("opt_cls,lr", [(torch.optim.Adam, 1e-2), (_momentum, 0.05)])
def test_parameters_are_bitwise_identical_with_and_without_the_monitor(opt_cls, lr):
    plain = run(optimizer=opt_cls, lr=lr, steps=25)
    found = run(optimizer=opt_cls, lr=lr, steps=25, monitor={})
    given = run(optimizer=opt_cls, lr=lr, steps=25, monitor={"optimizer": True})
    assert found.dbg.optimizer is found.optimizer  # the monitor did find it
    for a, b, c in zip(plain.params, found.params, given.params):
        assert torch.equal(a, b) and torch.equal(a, c)
    for a, b in zip(plain.losses, found.losses):
        assert torch.equal(a, b)


def _hook_counts():
    return len(O._global_optimizer_pre_hooks), len(O._global_optimizer_post_hooks)


@pytest.mark.parametrize("explicit", [False, True])
def test_global_hooks_are_removed_on_exit(explicit):
    before = _hook_counts()
    r = run(steps=3, monitor={"optimizer": True} if explicit else {})
    assert r.dbg.optimizer is r.optimizer and _hook_counts() == before


def test_global_hooks_are_removed_when_the_loop_raises():
    before = _hook_counts()
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    with pytest.raises(RuntimeError, match="boom"):
        with NeuralDbg(m):
            for step, (x, y) in enumerate(data(5)):
                opt.zero_grad()
                F.cross_entropy(m(x), y).backward()
                assert _hook_counts() == (before[0] + 1, before[1] + 1)  # the monitor's pair, while active
                opt.step()
                if step == 2:
                    raise RuntimeError("boom")
    assert _hook_counts() == before
    # and an optimizer step after the monitor exited reaches none of its hooks
    opt.zero_grad()
    F.cross_entropy(m(data(1)[0][0]), data(1)[0][1]).backward()
    opt.step()


# ---- every > 1: steps between checks are not seen -----------------------------------------


def test_accumulation_over_unchecked_micro_steps_is_not_read_as_stale():
    """Regression, false alarm: with ``every=3`` and a step per two micro-batches (one
    ``record_loss`` each), the backward that follows a step sometimes falls on an unchecked
    micro-step; the checked one after it found last micro-batch's gradients and read the
    update as stale (16 of 16). A step followed by an unchecked step is now not judged."""
    dbg = train(mlp(), steps=60, accumulate=2, every=3)
    assert_quiet(dbg)
    assert (sig(dbg, STALE_STEPS) or 0) == 0


@pytest.mark.parametrize("k", [1, 4])
def test_every_three_still_reads_a_missing_zero_grad(k):
    # the step lands after record_loss opened the next (checked or not) step: still judged
    # where the step open after it is checked
    dbg = train(mlp(), steps=90, accumulate=k, every=3, zero=None)
    assert_bug(dbg, "stale_gradients")


@pytest.mark.parametrize("zero", [None, "optimizer", "model", "keep"])
def test_a_module_s_shared_gradient_hook_reads_the_loop_alike(zero):
    """Where a module's parameters share one gradient hook (``group_param_hooks_above``), its
    siblings may have accumulated before the hook reports the pass's first gradient: the stale
    check leaves them out (``ctx.accumulated_with``) and counts the same steps as with a hook each."""
    from neuraldbg.config import DetectorConfig

    each = train(mlp(), zero=zero, opt_cls=torch.optim.SGD, lr=0.05, config=DetectorConfig(param_grad_hooks=True))
    shared = train(mlp(), zero=zero, opt_cls=torch.optim.SGD, lr=0.05,
                   config=DetectorConfig(group_param_hooks_above=1, param_grad_hooks=True))
    assert shared._hooks.group_params and not each._hooks.group_params
    assert (sig(shared, STALE_STEPS), sig(shared, STALE_CHECKED)) == (sig(each, STALE_STEPS), sig(each, STALE_CHECKED))
    if zero is None:
        assert_bug(shared, "stale_gradients")
    else:
        assert_quiet(shared)
