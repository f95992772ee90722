"""The step size: per-layer update ratios on hand-computed tensors, and the measurement's lifecycle."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from neuraldbg.causal.nodes.causes import STEP_RATIO_MAX, STEP_RATIO_MEDIAN, STEP_RATIO_PEAK, STEP_RATIO_STEPS
from neuraldbg.monitor.measurements import step_size as G
from neuraldbg.monitor.measurements.weights import weight_census


def test_layer_ratios_on_hand_computed_tensors():
    before = [torch.tensor([[3.0, 4.0]]), torch.tensor([1.0]), torch.zeros(2)]
    after = [torch.tensor([[3.0, 4.5]]), torch.tensor([1.0]), torch.ones(2)]
    r = G.layer_ratios(before, after, torch.tensor([0, 0, 1]), 2)
    # layer 0: ||delta|| = 0.5 over ||w|| = sqrt(25 + 1); layer 1 has zero weights: no ratio
    assert r[0].item() == pytest.approx(0.5 / math.sqrt(26))
    assert math.isnan(r[1].item())


def test_probed_weights_are_nonzero_weight_matrices():
    a, b = nn.Linear(4, 8), nn.Linear(8, 4, bias=False)
    nn.init.zeros_(b.weight)  # zero by design: no scale for a ratio
    owner = G.probed_weights(weight_census([("a", a), ("b", b), ("norm", nn.LayerNorm(4))]))
    assert owner == {id(a.weight): "a"}


def _train(opt_cls, lr, steps=5, checked=True, act=nn.ReLU):
    """A StepSize measurement driven through its lifecycle by hand (no monitor)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), act(), nn.Linear(16, 4))
    opt = opt_cls(m.parameters(), lr=lr)
    ctx = SimpleNamespace(root=m, census=weight_census(m.named_modules()), step=0, is_primary=lambda o: o is opt)
    probe = G.StepSize()
    probe.enter(ctx)
    handles = [opt.register_step_pre_hook(lambda o, a, k: probe.optimizer_pre(ctx, o, checked)),
               opt.register_step_post_hook(lambda o, a, k: probe.optimizer_post(ctx, o, checked))]
    for step in range(steps):
        ctx.step = step
        opt.zero_grad()
        m(torch.randn(4, 8)).pow(2).sum().backward()
        opt.step()
    for h in handles:
        h.remove()
    return probe, m


def test_probe_reads_the_adam_step_size():
    probe, _ = _train(torch.optim.Adam, 1e-3)
    s = probe.summary()
    assert probe.n_steps == 5 and s[STEP_RATIO_STEPS] == 5
    # Adam's steps are about lr per element, against weights of RMS ~0.1..0.2
    assert 1e-3 < s[STEP_RATIO_MEDIAN] < 3e-2 and s[STEP_RATIO_MAX] >= s[STEP_RATIO_MEDIAN]
    assert probe.steps()[STEP_RATIO_MEDIAN] == 4  # known once the last measured step is done
    tiny = _train(torch.optim.Adam, 1e-8)[0].summary()
    assert tiny[STEP_RATIO_MAX] < 1e-6


def test_peak_is_adams_first_step_lr_over_the_weights_rms():
    """Adam's first update moves every element by lr exactly (|m_hat / sqrt(v_hat)| = 1), and no
    later one by more: the window's largest median-layer ratio is lr / rms(w) of the lower
    median layer at entry (two layers: torch's median is the lower of the two)."""
    torch.manual_seed(0)
    rms = [w.pow(2).mean().sqrt().item() for w in
           (nn.Linear(8, 16).weight, nn.Tanh(), nn.Linear(16, 4).weight) if isinstance(w, torch.Tensor)]
    lr = 1e-3
    probe, _ = _train(torch.optim.Adam, lr, act=nn.Tanh)  # Tanh: every weight gets a gradient
    s = probe.summary()
    assert s[STEP_RATIO_PEAK] == pytest.approx(min(lr / r for r in rms), rel=1e-3)
    assert s[STEP_RATIO_PEAK] >= s[STEP_RATIO_MEDIAN]


def test_probe_copies_nothing_on_unchecked_steps_and_is_bounded():
    probe, _ = _train(torch.optim.SGD, 0.1, checked=False)
    assert probe.n_steps == 0 and probe.summary() == {}
    probe, _ = _train(torch.optim.SGD, 0.1, steps=G.StepSize.WINDOW + 5)
    assert probe.n_steps == G.StepSize.WINDOW


def test_probe_does_not_change_training():
    a = _train(torch.optim.AdamW, 1e-2)[1]
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(5):
        opt.zero_grad()
        m(torch.randn(4, 8)).pow(2).sum().backward()
        opt.step()
    for p, q in zip(a.parameters(), m.parameters()):
        assert torch.equal(p, q)
