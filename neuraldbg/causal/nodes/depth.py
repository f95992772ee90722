"""Structural evidence read from the layer list: a deep plain stack, or a deep saturating one.

Cut points (reasoning in ``docs/causal_model.md``): ``depth_risk`` is "deep" with at least
``DEEP_LAYERS`` parameter layers and no normalization layer, "deep_saturating" with at least
``SATURATING_DEPTH`` saturating activation modules (sigmoid, tanh...) and no normalization.
A layer is normalization by its torch class name (``NORM_TYPES``, the fast path) or by its
measured role ``"norm"`` (``neuraldbg/monitor/roles.py``: a library class such as
``T5LayerNorm`` or ``LlamaRMSNorm``, or a user's own, found by what its first forward does).
"""
from __future__ import annotations

from typing import Sequence

from neuraldbg.causal.structure import Reading, Table
from neuraldbg.causal.view import TraceView
from neuraldbg.trace import LayerInfo, Trace

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 50

DEEP_LAYERS = 12
SATURATING_DEPTH = 6

SATURATING_TYPES = frozenset({"Sigmoid", "Tanh", "Hardtanh", "Hardsigmoid", "Softsign", "LogSigmoid",
                              "Tanhshrink"})
NORM_TYPES = frozenset({"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LayerNorm",
                        "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "RMSNorm",
                        "LocalResponseNorm", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d"})


def is_norm(layer: LayerInfo) -> bool:
    """Whether a monitored layer is a normalization layer: by class name or by measured role."""
    return layer.type in NORM_TYPES or layer.role == "norm"


def _block_of(name: str) -> tuple[str, str] | None:
    """``(stack, block)`` of a layer inside a numbered stack of blocks: the qualified name up to
    its first numeric part and up to the part before it (``bert.encoder.layer.3.output.dense``
    -> ``("bert.encoder.layer", "bert.encoder.layer.3")``); ``None`` outside any stack."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p.isdigit() and i > 0:
            return ".".join(parts[:i]), ".".join(parts[:i + 1])
    return None


def _attention(layer: LayerInfo) -> bool:
    """Whether a monitored layer is part of an attention: a query/key role, an attention module
    type, or an attention name part."""
    if layer.role == "attn_qk" or "attention" in layer.type.lower():
        return True
    return any("attn" in p.lower() or "attention" in p.lower() for p in layer.name.split(".")[:-1])


def postnorm_depth(layers: Sequence[LayerInfo]) -> int:
    """The number of post-norm attention blocks in the model's longest stack. Pure.

    A block (one numbered child of a stack: ``encoder.layers.3``) is *post-norm* when the last of
    its parameter layers in forward order is a normalization layer -- the norm follows the
    residual add, as in BERT or ``nn.TransformerEncoderLayer(norm_first=False)`` -- and it holds
    an attention layer (a ResNet block also ends in a norm, but before its add; the instability
    of post-norm stacks is the attention stack's). Pre-norm blocks (GPT-2, Llama, ViT) end in a
    linear layer. A layer inside another monitored layer (``nn.MultiheadAttention``'s
    ``out_proj``, which its parent's forward uses without calling it) is left out: it is never
    called, so the monitor lists it after every layer that was.
    """
    names = {li.name for li in layers}
    blocks: dict[tuple[str, str], list[LayerInfo]] = {}
    for li in sorted(layers, key=lambda li: li.index):
        key = _block_of(li.name)
        parts = li.name.split(".")
        nested = any(".".join(parts[:i]) in names for i in range(1, len(parts)))
        if key is not None and not nested and (li.n_params > 0 or is_norm(li)):
            blocks.setdefault(key, []).append(li)
    per_stack: dict[str, int] = {}
    for (stack, _), members in blocks.items():
        if is_norm(members[-1]) and any(_attention(li) for li in members):
            per_stack[stack] = per_stack.get(stack, 0) + 1
    return max(per_stack.values(), default=0)


def _counts(trace: Trace) -> tuple[int, int, int]:
    """(parameter layers that are not normalization, saturating activations, normalization layers)."""
    norm = [is_norm(li) for li in trace.layers]
    n_param = sum(1 for li, nm in zip(trace.layers, norm) if li.n_params > 0 and not nm)
    return n_param, sum(li.type in SATURATING_TYPES for li in trace.layers), sum(norm)


def depth_risk_state(trace: Trace) -> str | None:
    """'low', 'deep' or 'deep_saturating' from the layer list (None: no layers)."""
    if not trace.layers:
        return None
    n_param, n_sat, n_norm = _counts(trace)
    if n_norm == 0 and n_sat >= SATURATING_DEPTH:
        return "deep_saturating"
    if n_norm == 0 and n_param >= DEEP_LAYERS:
        return "deep"
    return "low"


def depth_risk(view: TraceView) -> Reading | None:
    """Structural risk of the monitored model."""
    risk = depth_risk_state(view.trace)
    if risk is None:
        return Reading(None, reason="no layer was monitored")
    n_param, n_sat, n_norm = _counts(view.trace)
    return Reading(risk, (), f"{n_param} parameter layers, {n_sat} saturating activations, "
                             f"{n_norm} normalization layers ({risk})")


NODES = (
    Table(
        "depth_risk", ("low", "deep", "deep_saturating"), parents=("architecture",),
        rows=(
            ({"architecture": "ok"}, (0.88, 0.09, 0.03)),
            ({"architecture": "unstable"}, (0.35, 0.30, 0.35)),
        ),
        why="Structural evidence read from the layer list: a deep plain stack without "
            "normalization, or a stack of saturating activations.",
        extract=depth_risk,
    ),
)
