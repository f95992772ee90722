"""transformer and lora: the text, the model, attention signals and the LoRA mechanics."""
from __future__ import annotations

import math

import torch

import models
from models import lora as L
from models.transformer import ALPHABET, GPT, MarkovText, TransformerConfig
from zoo_testing import cached_run


def test_markov_text_is_seeded_and_in_the_alphabet():
    a, b = MarkovText(0, 0), MarkovText(0, 0)
    assert torch.equal(a.data, b.data) and a.words == b.words
    assert not torch.equal(a.data, MarkovText(0, 1).data)  # another stream, same language
    assert a.words == MarkovText(0, 1).words and a.words != MarkovText(1, 0).words
    assert 0 <= int(a.data.min()) and int(a.data.max()) < len(ALPHABET)
    x, y = a.batch(4, 32)
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])


def test_gpt_is_causal():
    torch.manual_seed(0)
    m = GPT(TransformerConfig()).eval()
    x = torch.randint(len(ALPHABET), (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % len(ALPHABET)  # change the future only
    assert torch.allclose(m(x)[0, :10], m(y)[0, :10])


def test_attention_entropy_signal():
    h = cached_run("transformer", "healthy", 0)
    c = cached_run("transformer", "attention_collapse", 0)
    e_h, e_c = h.series("attention_entropy"), c.series("attention_entropy")
    assert e_h[0] > 0.8 * math.log(16)  # near-uniform at init over ~T/2 visible keys
    assert max(e_c) < 0.25 * min(e_h)  # collapsed from the start


def test_nan_softmax_starts_in_the_attention():
    r = cached_run("transformer", "nan_softmax", 0)
    # padded targets are ignored, so the loss of the onset step is still finite; the NaN
    # probabilities poison the backward pass and every later step
    assert math.isfinite(r.losses[r.onset]) and r.first_nonfinite_step == r.onset + 1


def test_lora_linear_starts_as_the_base_and_freezes_it():
    base = torch.nn.Linear(8, 6)
    lora = L.LoRALinear(base, rank=2, alpha=4)
    x = torch.randn(3, 8)
    assert torch.equal(lora(x), base(x))  # B = 0
    assert not any(p.requires_grad for p in base.parameters())
    assert lora.lora_A.requires_grad and lora.lora_B.requires_grad and lora.scaling == 2


def test_lora_trains_only_the_adapters_and_caches_pretraining():
    spec = models.get_arch("lora")
    inj = models.get_injection("lora", "healthy").bind(spec)
    t = spec.trainer(spec.config(), 0, inj)
    assert len(L._PRETRAINED) >= 1  # cached after the first build
    frozen = {n: p.detach().clone() for n, p in t.model.named_parameters() if not p.requires_grad}
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    for step in range(5):
        t.forward_backward(step)
        t.optimizer_step(step)
    for n, p in t.model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
    # a rebuilt base is the cached pre-trained one, bit for bit
    t2 = spec.trainer(spec.config(), 0, inj)
    assert float(t2.task_a_before) == float(t.task_a_before)


def test_lora_healthy_keeps_task_a_better_than_forgetting():
    h, f = cached_run("lora", "healthy", 0), cached_run("lora", "lora_forgetting", 0)
    assert h.metrics["task_a_before"] < 1.5  # the base really learned task A
    assert f.metrics["task_a_after"] > h.metrics["task_a_after"] + 0.5
    # ... while task B is learned at least as well: forgetting, not failure
    assert sum(f.losses[-15:]) <= sum(h.losses[-15:]) * 1.1
