"""The models and reference arms of the overhead harness (:mod:`benchmarks.overhead`).

Each ``make_*`` builds one model from a seed with its loss, ``loss(model, step)``, over a fixed
cycle of batches on the device; :data:`MODELS` names them for ``--model``. The reference arms'
set-ups live here too: :func:`null_hooks` (the floor of any per-module hook) and
:func:`cockpit_for` (Cockpit's economy configuration on the classifiers BackPACK extends).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F


class ClassifierLoss:
    """``loss(model, step)``: the cross-entropy of the model on the step's batch, from a fixed
    cycle of batches; ``batch(step)`` gives that batch's ``(inputs, labels)`` (the Cockpit arm
    computes its losses itself, as Cockpit's own loop does)."""

    def __init__(self, xs: torch.Tensor, ys: torch.Tensor) -> None:
        self.xs, self.ys = xs, ys

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs and labels of step ``i``."""
        return self.xs[i % len(self.xs)], self.ys[i % len(self.ys)]

    def __call__(self, m: nn.Module, i: int) -> torch.Tensor:
        x, y = self.batch(i)
        return F.cross_entropy(m(x), y)


def make_mlp(seed: int, device: str) -> tuple[nn.Module, Callable]:
    """MLP 256-512-512-256-10 with ReLU, batch 128 (528,138 parameters)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    xs = torch.randn(8, 128, 256, generator=gen, device=device)
    ys = torch.randint(0, 10, (8, 128), generator=gen, device=device)
    return model, ClassifierLoss(xs, ys)


class TinyEncoder(nn.Module):
    """Token embedding, ``nn.TransformerEncoder`` (4 layers, d=64, 4 heads) and a class head."""

    def __init__(self, vocab: int = 256, d: int = 64, layers: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, dim_feedforward=4 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def make_transformer(seed: int, device: str) -> tuple[nn.Module, Callable]:
    """:class:`TinyEncoder` on batches of 16 sequences of 32 tokens."""
    torch.manual_seed(seed)
    model = TinyEncoder().to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    xs = torch.randint(0, 256, (8, 16, 32), generator=gen, device=device)
    ys = torch.randint(0, 10, (8, 16), generator=gen, device=device)
    return model, lambda m, i: F.cross_entropy(m(xs[i % 8]), ys[i % 8])


class Parallel(nn.Module):
    """``n`` small Linear(16, 16) layers side by side, averaged: many layers, a healthy run
    (no event fires, so the figure is the cost of measuring, not of reporting)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(layer(x[:, i]) for i, layer in enumerate(self.layers)) / len(self.layers)


def make_parallel(n: int, seed: int, device: str) -> tuple[nn.Module, Callable]:
    """:class:`Parallel` with ``n`` layers on batches of 32, a regression target."""
    torch.manual_seed(seed)
    model = Parallel(n).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    xs = torch.randn(4, 32, n, 16, generator=gen, device=device)
    ys = torch.randn(4, 32, 16, generator=gen, device=device)
    return model, lambda m, i: F.mse_loss(m(xs[i % 4]), ys[i % 4])


class DeepStack(nn.Sequential):
    """``n`` blocks of ``Linear(32, 32)`` + ReLU and a 10-class head: many small modules, so
    that per-module work (Python in hooks, kernel launches) dominates the step."""

    def __init__(self, n: int, width: int = 32, classes: int = 10) -> None:
        blocks: list[nn.Module] = []
        for _ in range(n):
            blocks += [nn.Linear(width, width), nn.ReLU()]
        super().__init__(*blocks, nn.Linear(width, classes))


def make_deep(n: int, seed: int, device: str) -> tuple[nn.Module, Callable]:
    """:class:`DeepStack` of ``n`` blocks on batches of 32."""
    torch.manual_seed(seed)
    model = DeepStack(n).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    xs = torch.randn(8, 32, 32, generator=gen, device=device)
    ys = torch.randint(0, 10, (8, 32), generator=gen, device=device)
    return model, ClassifierLoss(xs, ys)


#: the HF row's config: 12 BERT layers, narrow enough for a CPU thread (nothing downloaded)
BERT = dict(num_hidden_layers=12, hidden_size=128, num_attention_heads=4, intermediate_size=512,
            vocab_size=2000, max_position_embeddings=64, num_labels=4)


def make_bert(seed: int, device: str) -> tuple[nn.Module, Callable]:
    """``transformers.BertForSequenceClassification`` built from a :data:`BERT` config (random
    init), batches of 8 sequences of 64 tokens; the loss is the model's own (``labels=``)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(**BERT)).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(0, BERT["vocab_size"], (8, 8, 64), generator=gen, device=device)
    ys = torch.randint(0, BERT["num_labels"], (8, 8), generator=gen, device=device)
    return model, lambda m, i: m(input_ids=ids[i % 8], labels=ys[i % 8]).loss


MODELS = {"mlp": make_mlp, "transformer": make_transformer,
          "deep100": lambda seed, dev: make_deep(100, seed, dev),
          "deep500": lambda seed, dev: make_deep(500, seed, dev),
          "bert": make_bert}


def null_hooks(model: nn.Module) -> list:
    """A forward hook on every module the monitor would hook and a post-accumulate-grad hook on
    every trainable parameter, all returning at once; their handles."""
    from neuraldbg.monitor.records import monitored_modules

    def fwd(module, args, output):
        return None

    def grad(param):
        return None

    handles = [m.register_forward_hook(fwd) for _, m in monitored_modules(model)]
    handles += [p.register_post_accumulate_grad_hook(grad) for p in model.parameters() if p.requires_grad]
    return handles


def one_pass_hooks(model: nn.Module, sink: list) -> list:
    """The reference of one pass over the data, from torch alone: a forward hook on every module
    the monitor would hook that reduces its output once (a norm, kept in ``sink`` until the step
    ends, as a monitor keeps its statistics for the transfer); the gradients' pass is
    :func:`one_pass_gradients`, at the step. Their handles."""
    from neuraldbg.monitor.records import monitored_modules

    def fwd(module, args, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point() and torch.is_grad_enabled():
            sink.append(torch.linalg.vector_norm(output.detach()))

    return [m.register_forward_hook(fwd) for _, m in monitored_modules(model)]


def one_pass_gradients(params: list, sink: list) -> None:
    """One ``torch._foreach_norm`` over every gradient: the other half of the one-pass reference."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        sink.extend(torch._foreach_norm(grads))


#: the models the Cockpit arm runs on (BackPACK extends their layers)
COCKPIT_MODELS = ("mlp", "deep100", "deep500")


def cockpit_for(model: nn.Module, loss_fn: Callable, every: int) -> tuple[nn.Module, Any, nn.Module]:
    """Cockpit's economy configuration tracking every ``every``-th step, as its documentation
    sets it up: the model and loss extended by BackPACK, a :class:`cockpit.Cockpit` over the
    parameters. Returns ``(model, cockpit, loss module)``; a clear error where Cockpit is not
    installed or the model is not one of the plain classifiers BackPACK extends here."""
    try:
        from backpack import extend
        from cockpit import Cockpit
        from cockpit.utils.configuration import configuration
        from cockpit.utils.schedules import linear
    except ImportError as e:
        raise SystemExit(f"--arm cockpit needs Cockpit: pip install cockpit-for-pytorch 'setuptools<75' "
                         f"(Cockpit imports pkg_resources; here: {e})") from e
    if not isinstance(loss_fn, ClassifierLoss):
        raise SystemExit("--arm cockpit runs on the classifiers of Linear and ReLU layers that BackPACK "
                         f"extends: --model {' '.join(COCKPIT_MODELS)}")
    model = extend(model)
    ck = Cockpit(model.parameters(), quantities=configuration("economy", track_schedule=linear(every)))
    return model, ck, extend(nn.CrossEntropyLoss())
