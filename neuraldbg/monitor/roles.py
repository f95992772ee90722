"""Layer roles: what a monitored module does, beyond its class name.

Two roles change how the diagnosis reads a layer (``docs/causal_model.md``):

* ``"attn_qk"`` -- an attention query or key projection. Its gradient at initialization is small
  by construction (near-uniform attention rows pass little gradient to the scores), so a
  vanishing reading there is no sign of a stuck signal (``neuraldbg/causal/nodes/layers.py``).
  Told by name: the module's last name part is a query/key name (:data:`QK_NAMES`) and the
  module sits inside an attention block (an ancestor's class or name says so). Fused projections
  (GPT-2's ``c_attn``, ``nn.MultiheadAttention``'s ``in_proj_weight``) are *not* given the role:
  their one gradient also holds the value slice, whose gradient is normal at init, so a small
  fused gradient is not the query/key artefact.
* ``"norm"`` -- a normalization layer (``neuraldbg/causal/nodes/depth.py``). The class names of
  torch's own (``NORM_TYPES`` there) are the fast path; any other module with a per-feature
  weight is tested once, on its first forward: its output, with the affine undone, must equal its input
  normalized over the last dimension (:func:`normalizes_last_dim`). One host read for the whole
  model, on the first forward only; no per-step cost, and the output is never touched.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable

import torch
from torch import nn

from neuraldbg.causal.nodes.depth import NORM_TYPES

log = logging.getLogger("neuraldbg")

#: last name parts of attention query/key projections: BERT/ViT (query, key), Llama/Mistral/OPT
#: (q_proj, k_proj), T5 (q, k), DistilBERT (q_lin, k_lin), diffusers (to_q, to_k), Meta's Llama
#: (wq, wk)
QK_NAMES = frozenset({"query", "key", "q_proj", "k_proj", "q", "k", "q_lin", "k_lin", "to_q", "to_k",
                      "wq", "wk"})

#: the probe's tolerance: the RMS of (de-affined output - normalized input) over the RMS of the
#: normalized input (1 by construction). A norm's own epsilon moves rows of RMS r by about
#: eps / (2 r^2): under 1e-3 for r >= 0.03 at eps 1e-5; float16/bfloat16 rounding is 4e-3 at most
NORM_TOLERANCE = 2e-2
#: the probe's input rows must not be normalized already (RMS within this of 1, or
#: mean within this of 0 and std within it of 1), else the test cannot tell a norm from identity
ALREADY_NORMAL = 0.05
#: rows the probe reads (the first ones of the flattened output): enough for a median
PROBE_ROWS = 64


def _attention_context(name: str, modules: dict[str, nn.Module]) -> bool:
    """Whether a module named ``name`` sits inside an attention block: an ancestor's class name
    or a part of the qualified name mentions attention."""
    parts = name.split(".")
    if any("attn" in p.lower() or "attention" in p.lower() for p in parts[:-1]):
        return True
    for i in range(len(parts) - 1, 0, -1):
        cls = type(modules.get(".".join(parts[:i]), None)).__name__.lower()
        if "attention" in cls or "attn" in cls:
            return True
    return False


def is_attention_qk(name: str, module: nn.Module, modules: dict[str, nn.Module]) -> bool:
    """Whether the leaf ``module`` (qualified ``name`` in ``modules``, the root's named modules)
    is an attention query or key projection: a 2-d weight, a query/key name, inside attention."""
    last = name.rsplit(".", 1)[-1].lower()
    w = getattr(module, "weight", None)
    return (last in QK_NAMES and isinstance(w, torch.Tensor) and w.dim() == 2
            and _attention_context(name, modules))


def per_feature_weight(module: nn.Module) -> torch.Tensor | None:
    """The module's own 1-d ``weight`` when every parameter it owns is 1-d of that size (a norm's
    affine), else ``None``."""
    params = list(module.parameters(recurse=False))
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or not params:
        return None
    return w if all(p.dim() == 1 and p.numel() == w.numel() for p in params) else None


def normalizes_last_dim(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None = None) -> bool:
    """Whether ``y = weight * normalize(x) + bias`` over the last dimension, for a layer norm
    (centred and scaled) or an RMS norm (scaled), on the median row.

    False when the shapes do not fit a per-feature affine, when ``x`` is already normalized
    (identity would pass), or when the weight is zero somewhere (the affine cannot be undone).
    """
    d = weight.numel()
    if x.shape != y.shape or x.shape[-1] != d or d < 2 or not torch.all(weight != 0):
        return False
    x = x.detach().reshape(-1, d)[:PROBE_ROWS].double()
    y = y.detach().reshape(-1, d)[:PROBE_ROWS].double()
    w = weight.detach().double()
    b = bias.detach().double() if bias is not None else 0.0
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        return False
    z = (y - b) / w  # the output before its affine
    mean, std = x.mean(-1, keepdim=True), x.std(-1, unbiased=False, keepdim=True)
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()
    if (rms.median() - 1).abs() < ALREADY_NORMAL or (
            mean.abs().median() < ALREADY_NORMAL and (std.median() - 1).abs() < ALREADY_NORMAL):
        return False

    def err(ref: torch.Tensor) -> float:
        row = ((z - ref).pow(2).mean(-1) / ref.pow(2).mean(-1).clamp_min(1e-30)).sqrt()
        return float(row.median())

    ok = rms.squeeze(-1) > 0
    if not ok.any():
        return False
    return min(err((x - mean) / std.clamp_min(1e-30)), err(x / rms.clamp_min(1e-30))) < NORM_TOLERANCE


class LayerRoles:
    """The roles of the monitored leaf modules; the norm probe runs on their first forward."""

    def __init__(self, root: nn.Module, leaves: Iterable[tuple[str, nn.Module]]) -> None:
        modules = dict(root.named_modules())
        self._roles: dict[str, str] = {}
        self._handles: list[Any] = []
        #: probed modules by class, and the classes a probe proved to normalize: an instance whose
        #: own probe could not decide (its input was normalized already, as T5's first decoder
        #: norm reading unit-variance embeddings) runs the same forward code as its proven peers
        self._probed: dict[str, type] = {}
        self._proven: set[type] = set()
        for name, mod in leaves:
            if type(mod).__name__ in NORM_TYPES:
                self._roles[name] = "norm"
            elif is_attention_qk(name, mod, modules):
                self._roles[name] = "attn_qk"
            elif per_feature_weight(mod) is not None:
                self._probed[name] = type(mod)
                self._handles.append(mod.register_forward_hook(self._probe_hook(name)))

    def _probe_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self._done(module)
            try:
                x = args[0] if args else None
                w = per_feature_weight(module)
                if isinstance(x, torch.Tensor) and isinstance(output, torch.Tensor) and w is not None \
                        and x.is_floating_point() and output.is_floating_point():
                    with torch.no_grad():
                        b = getattr(module, "bias", None)
                        if normalizes_last_dim(x, output, w, b if isinstance(b, torch.Tensor) else None):
                            self._roles[name] = "norm"
                            self._proven.add(type(module))
            except Exception as e:  # noqa: BLE001 - a probe never breaks training
                log.debug("neuraldbg: norm probe failed on %s: %r", name, e)
        return hook

    def _done(self, module: nn.Module) -> None:
        # one forward per module: remove this module's hook (the others wait for theirs)
        for h in list(self._handles):
            if h.id in getattr(module, "_forward_hooks", {}):
                h.remove()
                self._handles.remove(h)

    def remove(self) -> None:
        """Remove the probes not run yet (the monitor exits)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def role(self, name: str) -> str:
        """``"norm"``, ``"attn_qk"`` or ``""`` (no special role) for the layer ``name``; a probed
        module whose class another instance's probe proved a norm is one too."""
        role = self._roles.get(name, "")
        if not role and self._probed.get(name) in self._proven:
            return "norm"
        return role
