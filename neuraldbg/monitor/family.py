"""Guess a model's architecture family from its module types (no pgmpy, no forward pass).

Rules run from the most specific family to the most generic, first match wins:

1. ``lora``: a module whose class name contains "lora", or parameters named ``lora_A``/``lora_B``
   (PEFT and most hand-written adapters);
2. ``gan``: a generator *and* a discriminator/critic (by child or class name);
3. ``diffusion``: U-Net / timestep-embedding / diffusion class names;
4. ``gnn``: graph convolution / message passing class names (PyG, DGL, hand-written);
5. ``rl``: policy / actor-critic / Q-network class names;
6. ``transformer``: ``nn.MultiheadAttention``, ``nn.Transformer*`` or a class name with
   "attention"/"transformer";
7. ``rnn``: ``nn.RNNBase`` (RNN, LSTM, GRU) or ``nn.RNNCellBase`` cells;
8. ``transformer``: an ``nn.Embedding`` without recurrence (token models);
9. ``cnn``: any convolution (``nn.modules.conv._ConvNd``);
10. ``mlp``: everything else.
"""
from __future__ import annotations

import logging
from typing import Any

from neuraldbg.vocab import FAMILIES

log = logging.getLogger("neuraldbg")

_DIFFUSION = ("unet", "diffusion", "timestep", "noisepredictor", "denoiser", "ddpm")
_GNN = ("gcn", "gat", "graphconv", "messagepassing", "sageconv", "ginconv", "gnn", "graphsage",
        "chebconv", "edgeconv")
_RL = ("policy", "actorcritic", "actor", "qnetwork", "qnet", "dqn", "valuehead", "critic")


def _names(model: Any) -> tuple[list[str], list[str], list[str]]:
    classes = [type(m).__name__.lower() for m in model.modules()]
    children = [n.lower() for n, _ in model.named_modules() if n]
    params = [n for n, _ in model.named_parameters()]
    return classes, children, params


def detect_family(model: Any) -> str:
    """The family of ``model`` (one of :data:`neuraldbg.vocab.FAMILIES`), from ``torch.nn`` types
    and class names."""
    from torch import nn  # the caller already has torch loaded; keep this module import-light

    if not isinstance(model, nn.Module):
        raise TypeError(f"detect_family expects a torch.nn.Module, got {type(model).__name__}")
    # unwrap DataParallel/DDP/torch.compile wrappers so the real modules are inspected
    inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
    if isinstance(inner, nn.Module):
        model = inner
    classes, children, params = _names(model)
    mods = list(model.modules())

    def any_class(keys: tuple[str, ...]) -> bool:
        return any(k in c for c in classes for k in keys)

    def reason(fam: str, why: str) -> str:
        assert fam in FAMILIES, fam  # every rule must name a family that has shipped priors
        log.debug("family %r detected for %s: %s", fam, type(model).__name__, why)
        return fam

    if any("lora" in c for c in classes) or any(("lora_a" in p.lower() or "lora_b" in p.lower()) for p in params):
        return reason("lora", "LoRA adapter modules or parameters")
    leaf_names = [n.rsplit(".", 1)[-1] for n in children]
    has_gen = any("generator" in c for c in classes) or any(n in ("generator", "gen", "netg", "g") for n in leaf_names)
    has_disc = any(("discriminator" in c) for c in classes) or any(
        n in ("discriminator", "disc", "netd", "d", "critic") for n in leaf_names)
    if has_gen and has_disc:
        return reason("gan", "generator and discriminator")
    if any_class(_DIFFUSION):
        return reason("diffusion", "U-Net / timestep / diffusion modules")
    if any_class(_GNN):
        return reason("gnn", "graph convolution modules")
    if any_class(_RL):
        return reason("rl", "policy / actor-critic / Q-network modules")
    attn_types = (nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoderLayer,
                  nn.TransformerDecoderLayer, nn.TransformerEncoder, nn.TransformerDecoder)
    if any(isinstance(m, attn_types) for m in mods) or any_class(("attention", "transformer", "selfattn")):
        return reason("transformer", "attention modules")
    if any(isinstance(m, (nn.RNNBase, nn.RNNCellBase)) for m in mods):
        return reason("rnn", "recurrent modules")
    if any(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in mods):
        return reason("transformer", "token embeddings without recurrence")
    if any(isinstance(m, nn.modules.conv._ConvNd) for m in mods):
        return reason("cnn", "convolutions")
    return reason("mlp", "no more specific module type")
