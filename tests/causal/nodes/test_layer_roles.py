"""The three role rules on hand-computed values: attention q/k vanishing at init, saturation at
the loss floor, growth judged per unit of learning rate; and normalization by what a layer does."""
import math

import numpy as np
import torch
from torch import nn

from neuraldbg.causal.nodes.depth import depth_risk_state, is_norm
from neuraldbg.causal.nodes.layers import loss_at_floor, qk_at_init, saturation, vanishing
from neuraldbg.causal.view import TraceView
from neuraldbg.config import DetectorConfig
from neuraldbg.events.base import ACTIVATION, GRADIENT, make_event
from neuraldbg.events.gradient import GradientHealthDetector, lr_allowance
from neuraldbg.events.registry import DetectorContext
from neuraldbg.events.stepstats import StepStats
from neuraldbg.monitor.roles import is_attention_qk, normalizes_last_dim, per_feature_weight
from neuraldbg.trace import LayerInfo
from tests.tiny import make_trace


class SelfAttention(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)


class Block(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.attention = SelfAttention(d)
        self.key = nn.Linear(d, d)  # a "key" outside any attention block: a plain layer
        self.c_attn = nn.Linear(d, 3 * d)  # fused q, k, v: its gradient holds the value slice


def test_attention_qk_by_name_inside_attention_only():
    root = nn.Module()
    root.h = Block()
    mods = dict(root.named_modules())
    qk = {n for n, m in mods.items() if is_attention_qk(n, m, mods)}
    assert qk == {"h.attention.query", "h.attention.key"}
    # Llama naming: the ancestor's class is not needed when the path says attention
    mods2 = {"layers.0.self_attn.q_proj": nn.Linear(4, 4)}
    assert is_attention_qk("layers.0.self_attn.q_proj", mods2["layers.0.self_attn.q_proj"], mods2)


def test_qk_at_init_excuses_only_a_qk_layer_small_from_init():
    ev = [make_event(GRADIENT, "vanishing", "att.query", 0, 1.0, {}),
          make_event(GRADIENT, "vanishing", "att.query", 40, 1.0, {}),  # the same layer, still small
          make_event(GRADIENT, "vanishing", "att.key", 50, 1.0, {}),    # became small later: a change
          make_event(GRADIENT, "vanishing", "fc", 0, 1.0, {})]          # not a q/k layer
    assert qk_at_init(ev, {"att.query", "att.key"}, lambda s: s < 1) == {"att.query"}


def _layers(qk_role: str):
    return [LayerInfo("emb", "Embedding", 0, 40), LayerInfo("att.query", "Linear", 1, 20, role=qk_role),
            LayerInfo("att.key", "Linear", 2, 20, role=qk_role), LayerInfo("fc", "Linear", 3, 20)]


def test_vanishing_leaves_out_qk_at_init_whatever_the_loss():
    flat = [1.1] * 40  # a flat loss: the "loss keeps improving" excuse does not apply
    ev = [make_event(GRADIENT, "vanishing", "att.query", 0, 1.0, {"out_rms": 0.5}),
          make_event(GRADIENT, "vanishing", "att.key", 0, 1.0, {"out_rms": 0.5})]
    assert vanishing(TraceView(make_trace(ev, _layers("attn_qk"), flat))).state == "absent"
    assert vanishing(TraceView(make_trace(ev, _layers(""), flat))).state == "init_depth"
    # another layer vanishing too is still evidence
    ev2 = ev + [make_event(GRADIENT, "vanishing", "fc", 0, 1.0, {"out_rms": 0.5})]
    r = vanishing(TraceView(make_trace(ev2, _layers("attn_qk"), flat)))
    assert r.state == "init_depth" and {e.layer for e in r.support} == {"fc"}


def test_loss_at_floor_hand_computed():
    hist = [(s, 1.1) for s in range(10)] + [(s, 0.02) for s in range(10, 20)]
    chance = math.log(3)  # 1.0986: 0.02 is 1.8 % of it
    assert loss_at_floor(hist, 12, chance)
    assert not loss_at_floor(hist, 0, chance)  # from step 0: half at 1.1, the (upper) median 1.1
    assert not loss_at_floor([(s, 0.3) for s in range(20)], 12, chance)  # 27 % of chance
    # no chance level: against the run's own start (1.1): 0.02 / 1.1 < 0.05
    assert loss_at_floor(hist, 12, None)
    assert not loss_at_floor(hist[:13], 12, chance)  # one loss after the onset: too few


def test_saturation_later_at_the_floor_is_no_evidence():
    layers = [LayerInfo("pool", "Linear", 0, 10), LayerInfo("tanh", "Tanh", 1), LayerInfo("fc", "Linear", 2, 10)]
    sat = [make_event(ACTIVATION, "saturated", "tanh", 30, 0.9, {})]
    low = [0.7] * 10 + [0.2] * 20 + [0.005] * 30
    r = saturation(TraceView(make_trace(sat, layers, low, sigs={"out_features": 2})))
    assert r.state is None and "floor" in r.reason
    high = [0.7] * 10 + [0.5] * 50
    assert saturation(TraceView(make_trace(sat, layers, high, sigs={"out_features": 2}))).state == "later"


def test_lr_allowance_hand_computed():
    np.testing.assert_allclose(lr_allowance(0.8, np.array([0.1, np.nan, 1.0, 0.0])), [8.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(lr_allowance(None, np.array([0.1])), [1.0])


def _stats(step, rms, lr):
    st = StepStats(step=step, has_backward=True,
                   layers={k: {"pgrad_sumsq": v * v * 10, "pgrad_n": 10} for k, v in rms.items()})
    st.lr = lr
    return st


def test_growth_under_a_warmup_is_judged_per_unit_of_rate():
    ctx = DetectorContext("mlp", ("a", "b"), "a")
    det = GradientHealthDetector(DetectorConfig(), ctx)
    assert det.update(_stats(0, {"a": 1e-4, "b": 0.01}, 0.0)) == []  # rate 0: joins no baseline
    for s in range(1, 6):  # baseline formed at 1e-5 .. 5e-5 (median 3e-5)
        det.update(_stats(s, {"a": 1e-4, "b": 0.01}, s * 1e-5))
    # the rate is now 100x (3e-3 / 3e-5): growth of 500x is 5x per unit of rate
    assert not [e for e in det.update(_stats(6, {"a": 0.05, "b": 0.01}, 3e-3)) if e.kind == "exploding"]
    # 2e4x growth is 200x per unit of rate: still an explosion
    evs = det.update(_stats(7, {"a": 2.0, "b": 0.01}, 3e-3))
    assert [(e.kind, e.layer) for e in evs] == [("exploding", "a")]
    assert math.isclose(evs[0].measured["growth"], 200.0, rel_tol=1e-6)
    # without a known rate, growth is against the plain baseline (the former rule)
    det2 = GradientHealthDetector(DetectorConfig(), ctx)
    for s in range(5):
        det2.update(_stats(s, {"a": 1e-4, "b": 0.01}, None))
    assert [e.layer for e in det2.update(_stats(5, {"a": 0.05, "b": 0.01}, None)) if e.kind == "exploding"] == ["a"]


def test_normalizes_last_dim_hand_computed():
    w = torch.tensor([2.0, 2.0, 2.0, 2.0])
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0]])          # RMS 2.5
    assert normalizes_last_dim(x, torch.tensor([[2.4, 3.2, 0.0, 0.0]]), w)  # 2 * x / 2.5
    x2 = torch.tensor([[1.0, 2.0, 3.0, 4.0]])         # mean 2.5, std sqrt(1.25)
    z = torch.tensor([[-1.5, -0.5, 0.5, 1.5]]) / math.sqrt(1.25)
    b = torch.tensor([0.5, 0.5, 0.5, 0.5])
    assert normalizes_last_dim(x2, z * w + b, w, b)
    assert not normalizes_last_dim(x, x * w, w)        # a per-feature scale (LayerScale): no norm
    ones = torch.tensor([[1.0, -1.0, 1.0, -1.0]])     # already normalized: identity would pass
    assert not normalizes_last_dim(ones, ones * w, w)
    assert not normalizes_last_dim(x, torch.tensor([[2.4, 3.2, 0.0]]), w)  # shape does not fit


def test_per_feature_weight_and_norm_role():
    assert per_feature_weight(nn.Linear(4, 4)) is None
    ln = nn.LayerNorm(4)
    assert per_feature_weight(ln) is ln.weight
    assert is_norm(LayerInfo("n", "MyRMSNorm", 0, 4, role="norm")) and is_norm(LayerInfo("n", "LayerNorm", 0, 4))
    deep = [LayerInfo(f"l{i}", "Linear", 2 * i, 10) for i in range(14)]
    norms = [LayerInfo(f"n{i}", "MyRMSNorm", 2 * i + 1, 10, role="norm") for i in range(14)]
    assert depth_risk_state(make_trace(layers=deep + norms)) == "low"
    assert depth_risk_state(make_trace(layers=deep + [LayerInfo(n.name, n.type, n.index, 10) for n in norms])) == "deep"


def test_an_inconclusive_probe_takes_the_role_its_class_was_proven_to_have():
    """Regression: T5's first decoder norm reads the unit-variance token embeddings, already
    normalized, so its own probe cannot tell it from identity; its peers of the same class,
    reading unnormalized residual streams, prove the class normalizes."""
    from neuraldbg.monitor.roles import LayerRoles

    class MyRMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return self.weight * x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()

    first, later, scale = MyRMSNorm(8), MyRMSNorm(8), nn.Linear(8, 8)
    roles = LayerRoles(nn.Sequential(first, scale, later), [("0", first), ("1", scale), ("2", later)])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()  # rows of RMS 1 exactly: inconclusive
    first(x)
    assert roles.role("0") == ""                       # nothing proven yet
    later(5.0 * torch.randn(16, 8, generator=g))       # a stream off the unit scale: proven
    assert roles.role("2") == "norm" and roles.role("0") == "norm"
    assert roles.role("1") == ""                       # a Linear is never probed

