"""End to end, seconds each: one role rule decides the reading of a tiny model.

* attention query/key projections small at init, on a flat loss: no vanishing evidence, while
  the same model with its projections named otherwise reads vanishing at init;
* a tanh pooler saturating once a classifier's loss is at its floor: no saturation evidence;
* a user's own RMS norm class counts as normalization in the depth reading.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.causal import api
from neuraldbg.causal.nodes.depth import depth_risk_state
from neuraldbg.causal.view import TraceView
from tests.tiny import batches, run


class SelfAttention(nn.Module):
    """One head; ``names`` are the attribute names of its query and key projections."""

    def __init__(self, d: int, names=("query", "key")):
        super().__init__()
        self.names = names
        setattr(self, names[0], nn.Linear(d, d))
        setattr(self, names[1], nn.Linear(d, d))
        self.value = nn.Linear(d, d)
        for n in names:  # near-uniform attention at init: on this narrow model (d=16) std 0.002
            # gives the q/k gradients hf_bert's (std 0.02, d=768... the ecosystem suite) show,
            # under vanish_ratio x the largest layer's
            nn.init.normal_(getattr(self, n).weight, std=0.002)
            nn.init.zeros_(getattr(self, n).bias)

    def forward(self, x):
        q, k = getattr(self, self.names[0])(x), getattr(self, self.names[1])(x)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(x.shape[-1]), dim=-1)
        return x + a @ self.value(x)


class TinyEncoder(nn.Module):
    def __init__(self, d=16, classes=3, names=("query", "key")):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.norm = nn.LayerNorm(d)
        self.attention = SelfAttention(d, names)
        self.head = nn.Linear(d, classes)

    def forward(self, x):  # x: (batch, tokens, 8)
        return self.head(self.attention(self.norm(self.inp(x))).mean(dim=1))


def _flat_run(names):
    torch.manual_seed(0)
    model = TinyEncoder(names=names)
    gen = torch.Generator().manual_seed(0)
    data = []
    for _ in range(40):
        x = torch.randn(8, 6, 8, generator=gen)
        data.append((x, torch.randint(0, 3, (8,), generator=gen)))  # random labels: nothing to learn
    opt = torch.optim.SGD(model.parameters(), lr=1e-8)  # a flat loss, whatever the model does
    with NeuralDbg(model, optimizer=opt) as dbg:
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


def test_flat_attention_model_reads_no_vanishing_from_query_key():
    control = _flat_run(("alpha", "beta"))  # the same model, its projections not named as q/k
    tr_c = control.trace()
    van = [e for e in tr_c.events if e.kind == "vanishing"]
    assert van and {e.layer for e in van} <= {"attention.alpha", "attention.beta"}
    assert api.evidence(tr_c).observed["vanishing"] in ("init_depth", "init_uniform", ("init_depth", "init_uniform"))
    dbg = _flat_run(("query", "key"))
    tr = dbg.trace()
    roles = {li.name: li.role for li in tr.layers}
    assert roles["attention.query"] == roles["attention.key"] == "attn_qk" and roles["attention.value"] == ""
    assert [e for e in tr.events if e.kind == "vanishing"]  # the events are still recorded ...
    assert api.evidence(tr).observed["vanishing"] == "absent"  # ... but are no evidence


def test_confident_classifier_with_tanh_pooler_stays_healthy():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
    # separable with a margin (the class's input pushed up by 3): the loss can reach its floor
    data = [(x + 3 * F.one_hot(y, 8).float(), y) for x, y in batches(300, n=32)]
    r = run(model, steps=300, monitor={"optimizer": True}, optimizer=torch.optim.Adam, lr=0.01, data=data)
    tr = r.dbg.trace()
    sat = [e for e in tr.events if e.kind == "saturated"]
    assert sat and min(e.step for e in sat) > 0, "the pooler saturates once the model is confident"
    assert float(r.losses[-1]) < 0.05
    ev = api.evidence(tr)
    assert "saturation" not in ev.observed and "floor" in ev.unobserved["saturation"]
    top = r.dbg.get_causal_hypotheses()
    assert not top or (top[0].cause, top[0].state) != ("architecture", "unstable")
    assert r.dbg.posterior().p_healthy > 0.5


class MyRMSNorm(nn.Module):
    """A user's own RMS norm: a class name no list knows."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class LayerScale(nn.Module):
    """A per-feature weight that does not normalize: must not count."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.full((d,), 0.5))

    def forward(self, x):
        return self.weight * x


def test_custom_rms_norm_counts_as_normalization():
    def deep(norm):
        torch.manual_seed(0)
        mods = [nn.Linear(8, 16)]
        for _ in range(13):
            mods += [norm(16), nn.Linear(16, 16), nn.ReLU()]
        return nn.Sequential(*mods, nn.Linear(16, 3))

    tr = run(deep(MyRMSNorm), steps=5, monitor={}).dbg.trace()
    assert {li.role for li in tr.layers if li.type == "MyRMSNorm"} == {"norm"}
    assert depth_risk_state(tr) == "low"
    assert "13 normalization layers" in api.evidence(tr).notes["depth_risk"]
    tr2 = run(deep(LayerScale), steps=5, monitor={}).dbg.trace()
    assert {li.role for li in tr2.layers if li.type == "LayerScale"} == {""}
    assert depth_risk_state(tr2) == "deep"
    assert TraceView(tr2).trace is tr2


def test_roles_survive_a_session_round_trip(tmp_path):
    from neuraldbg.session import trace_from_dict, trace_to_dict

    tr = _flat_run(("query", "key")).trace()
    back, _ = trace_from_dict(trace_to_dict(tr))
    roles = {li.name: li.role for li in back.layers}
    assert roles["attention.query"] == "attn_qk" and roles["norm"] == "norm" and roles["head"] == ""
    assert back.layers == tr.layers


def test_library_rms_norms_are_probed_as_normalization():
    modeling = __import__("pytest").importorskip("transformers.models.llama.modeling_llama")
    t5 = __import__("pytest").importorskip("transformers.models.t5.modeling_t5")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.a = nn.Linear(8, 16), modeling.LlamaRMSNorm(16)
            self.mid, self.b = nn.Linear(16, 16), t5.T5LayerNorm(16)
            self.out = nn.Linear(16, 3)

        def forward(self, x):
            return self.out(self.b(self.mid(self.a(self.inp(x)))))

    torch.manual_seed(0)
    tr = run(Net(), steps=3, monitor={}).dbg.trace()
    assert {li.name: li.role for li in tr.layers if li.name in ("a", "b")} == {"a": "norm", "b": "norm"}
