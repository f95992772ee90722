"""The token-input watch: hashed id histograms of every embedding, on checked steps.

A forward pre-hook on each ``nn.Embedding`` adds the ids it reads into a histogram on the
device (:func:`neuraldbg.events.tokens.token_histogram`, no sync). Histograms wait on the
device and go to the host together, one transfer per ``sync_every`` checked steps (and on a
query or exit), where one :class:`~neuraldbg.events.tokens.TokenShiftDetector` per embedding
turns them into ``data_anomaly/shift`` events at that embedding, with ``at_input = 1``. A
position embedding reads the same ids every step and never shifts. Inside a ``torch.compile``
graph the watch is off (see ``_on_ids``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from neuraldbg.causal.nodes.data import TOKEN_WATCHED
from neuraldbg.events.tokens import TokenShiftDetector, token_histogram
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement


def embeddings(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every id-reading embedding in ``root``."""
    return [(n, m) for n, m in root.named_modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]


@register_measurement
class TokenWatch(Measurement):
    """Embedding id histograms and their shift detectors (one monitor's)."""

    signatures = (TOKEN_WATCHED,)

    def __init__(self) -> None:
        self._ctx: AddonContext | None = None
        self._handles: list[Any] = []
        self._pending: dict[tuple[int, str], torch.Tensor] = {}  # (step, layer) -> counts
        self._detectors: dict[str, TokenShiftDetector] = {}
        self._ready_at: int | None = None  # the step the first reference was complete

    @classmethod
    def for_monitor(cls, root: Any, settings: Any) -> "TokenWatch | None":
        """Only models that read token ids through an embedding."""
        return cls() if embeddings(root) else None

    def enter(self, ctx: AddonContext) -> None:
        """Hook every embedding."""
        self._ctx = ctx
        for name, mod in embeddings(ctx.root):
            self._handles.append(mod.register_forward_pre_hook(lambda m, args, name=name: self._on_ids(name, args)))

    def _on_ids(self, name: str, args: tuple) -> None:
        if torch.compiler.is_compiling():
            # off inside a compiled graph: its per-step bookkeeping would be guarded and
            # recompile the graph every step, and running it eagerly would break the graph
            return None
        ctx = self._ctx
        if not args or not ctx.measuring():
            return None
        ids = args[0]
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.numel() == 0:
            return None
        key = (ctx.step, name)
        h = token_histogram(ids)
        prev = self._pending.get(key)
        self._pending[key] = h if prev is None else prev + h  # a shared embedding called twice
        return None

    unchecked = ()  # histograms are taken on checked steps only: nothing to hand over otherwise

    def step_closed(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """Hand the histograms to the host once ``sync_every`` checked steps are waiting."""
        if len({s for s, _ in self._pending}) >= ctx.sync_every:
            self.flush(ctx)

    def flush(self, ctx: AddonContext) -> None:
        """One host transfer of the waiting histograms; their events go to the monitor's log."""
        if not self._pending:
            return
        keys = sorted(self._pending)
        rows = torch.stack([self._pending[k].to(self._pending[keys[0]].device) for k in keys]).cpu().numpy()
        self._pending = {}
        for (step, name), counts in zip(keys, rows):
            det = self._detectors.get(name)
            if det is None:
                det = self._detectors[name] = TokenShiftDetector(name, ctx.settings.config)
            for ev in det.update(step, np.asarray(counts, dtype=np.float64)):
                ctx.add_event(ev)
            if self._ready_at is None and det.reference_ready:
                self._ready_at = step

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Remove the hooks and read what is left."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.flush(ctx)

    def summary(self) -> dict[Any, Any]:
        """``token_watched``: embeddings whose reference is built (the absence of a token shift
        is then an observation)."""
        n = sum(d.reference_ready for d in self._detectors.values())
        return {TOKEN_WATCHED: n} if n else {}

    def steps(self) -> dict[Any, int]:
        """Watched from the step the first reference was complete."""
        return {TOKEN_WATCHED: self._ready_at} if self._ready_at is not None else {}
