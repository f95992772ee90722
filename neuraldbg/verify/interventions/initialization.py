"""``do(initialization = ok)``: the weight matrices off their reference scale re-drawn at it.

:func:`off_scale` finds them: their RMS against the reference scales of their type and fan-in
and against the model's own convention. The replay starts from the first snapshot, before any
update moved the weights.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from neuraldbg.verify.interventions import Context, Intervention, register_intervention

#: A weight matrix is re-initialized when its RMS is this many decades off every reference
#: scale, or :data:`CONVENTION_DECADES` off the model's own convention (below).
OFF_DECADES = 0.5
CONVENTION_DECADES = 1.0


def off_scale(model: nn.Module, references: Callable[[nn.Module, torch.Size], tuple]
              ) -> list[tuple[str, torch.Tensor, float, float]]:
    """``(layer, weight, log10 factor, reference std)`` of every weight matrix whose scale is
    off: more than :data:`OFF_DECADES` from every reference scale of its type and fan-in, or
    more than :data:`CONVENTION_DECADES` from the model's convention. The convention is, among
    the reference schemes (same position in the reference tuple, per tuple length), the one the
    model's matrices sit nearest to (smallest median distance): a GPT's std 0.02, PyTorch's
    default elsewhere; PyTorch's default when no matrix is near any reference. The reference
    std returned is that of the convention. Exactly-zero matrices (zero by design) and frozen
    ones are left out."""
    rows = []
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            # frozen weights (a pre-trained base under adapters) were loaded, not initialized
            if p.dim() < 2 or not p.is_floating_point() or p.is_sparse or p.numel() == 0 or not p.requires_grad:
                continue
            rms = float(p.detach().float().pow(2).mean().sqrt())
            if not (rms > 0 and math.isfinite(rms)):
                continue
            refs = tuple(r for r in references(mod, p.shape))
            rows.append((name, p, rms, refs))
    def nearest(rms: float, refs: tuple) -> float:
        return min((math.log10(rms / r) for r in refs), key=abs)

    conv: dict[int, int] = {}
    for n in {len(r) for *_, r in rows}:
        # the convention is read off the matrices near some reference: when every one is off
        # (the whole model scaled), PyTorch's default (position 0) is the reference
        group = [(rms, refs) for _, _, rms, refs in rows if len(refs) == n and abs(nearest(rms, refs)) <= OFF_DECADES]
        conv[n] = 0 if not group else min(
            range(n), key=lambda i: sorted(abs(math.log10(rms / refs[i])) for rms, refs in group)[len(group) // 2])
    out = []
    for name, p, rms, refs in rows:
        ref = refs[conv[len(refs)]]
        near, dev = nearest(rms, refs), math.log10(rms / ref)
        if abs(near) > OFF_DECADES or abs(dev) > CONVENTION_DECADES:
            out.append((name, p, dev if abs(dev) > CONVENTION_DECADES else near, ref))
    return out


class _Reinit(Intervention):
    from_start = True

    def describe(self) -> str:
        return "reference re-initialization of the layers whose initial weights are too " + \
            ("small" if self.state == "too_small" else "large")

    def _targets(self, ctx: Context) -> list[tuple[str, torch.Tensor, float, float]]:
        if ctx.references is None:
            return []
        sign = -1 if self.state == "too_small" else 1
        return [t for t in off_scale(ctx.model, ctx.references) if sign * t[2] > 0]

    def untestable(self, ctx: Context) -> str | None:
        if ctx.references is None:
            return "the monitor handed over no reference weight scales"
        if not self._targets(ctx):
            return f"no weight matrix starts {'below' if self.state == 'too_small' else 'above'} its reference scale"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        # a private generator: the replay's global RNG stream stays the original run's
        gen = torch.Generator().manual_seed(0)
        layers = []
        with torch.no_grad():
            for name, p, _, std in self._targets(ctx):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std).to(p.dtype))
                layers.append(name)
                ctx.acted += 1
        ctx.notes["layers"] = sorted(set(layers))
        return lambda: None  # the snapshot restored after the replay undoes it


@register_intervention("initialization", "too_small")
class ReinitSmall(_Reinit):
    """Weights too small: re-drawn at the reference scale from step 0."""


@register_intervention("initialization", "too_large")
class ReinitLarge(_Reinit):
    """Weights too large: re-drawn at the reference scale from step 0."""
