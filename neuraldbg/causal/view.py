"""A trace as the extractors read it: its events by kind, its layers, its check interval, memos.

Every evidence node's extractor (``neuraldbg/causal/nodes/``) receives one :class:`TraceView`
per extraction. The view computes the facts several extractors share once (the events of a
kind, the parameter layers, whether a step is "at init") and memoizes readings one extractor
needs from another (the loss pattern, say).
"""
from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

from neuraldbg.causal.nodes.run import EVERY, GRAD_STEPS, STATS_STEPS, unsupported
from neuraldbg.events.base import Event
from neuraldbg.trace import Trace
from neuraldbg.vocab import has_trait

if TYPE_CHECKING:  # structure imports this module's TraceView for its extractors
    from neuraldbg.causal.structure import Reading

#: an event is "at init" when it starts within the first ``INIT_STEPS`` checked steps: the first
#: step's gradients are computed before any update, so only weights, inputs and structure can
#: be at fault there
INIT_STEPS = 1


class TraceView:
    """Shared, cached facts of one trace (see the module docstring)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.events: list[Event] = list(trace.events)
        self.signatures = trace.signatures
        self._memo: dict[str, Any] = {}

    def memo(self, key: str, fn: Callable[["TraceView"], Any]) -> Any:
        """``fn(self)``, computed once per view (how one extractor reads another's result)."""
        if key not in self._memo:
            self._memo[key] = fn(self)
        return self._memo[key]

    def gap(self, sig: Any) -> str | None:
        """Why the run did not measure signature ``sig`` (``None``: no reason recorded)."""
        return self.signatures.gap(sig)

    def unmeasured(self, sig: Any, otherwise: str) -> "Reading":
        """The unobserved reading of a node whose signature ``sig`` (``None``: whose own
        statistics) is missing: the monitor's reason when it recorded one (a gap, or parameters
        of a tensor type it does not measure), else ``otherwise``."""
        from neuraldbg.causal.structure import Reading

        why = (self.signatures.gap(sig) if sig is not None else None) or unsupported(self.signatures)
        return Reading(None, reason=why or otherwise, gap=why is not None)

    def of_kind(self, type_: str, *kinds: str) -> list[Event]:
        """The events of ``type_`` whose kind is one of ``kinds``."""
        return [e for e in self.events if e.type == type_ and e.kind in kinds]

    def first(self, events: list[Event]) -> Event:
        """Earliest event; ties go to the input side (forward order), loss events last."""
        def key(e: Event) -> tuple:
            idx = self.trace.layer_index(e.layer)
            return (e.step, 10**9 if idx is None else idx)
        return min(events, key=key)

    @cached_property
    def every(self) -> int:
        """The monitor's check interval (``every``), 1 when the trace does not say."""
        v = self.signatures.number(EVERY)
        return max(1, int(v)) if v is not None else 1

    def is_init(self, step: int) -> bool:
        """Whether ``step`` is within the first ``INIT_STEPS`` checked steps."""
        return step < self.trace.first_step + INIT_STEPS * self.every

    def phase(self, state: str) -> str | tuple[str, ...]:
        """An at-init observation, or {it, 'later'} for families whose first step already holds
        an update (the ``alternating`` trait: a GAN steps its discriminator first)."""
        return (state, "later") if has_trait(self.trace.family, "alternating") else state

    @cached_property
    def watched(self) -> bool:
        """Whether detectors ran on layers (absence of a layer event is then evidence): layers
        were monitored and their statistics reached the detectors on some checked step
        (sessions written before that count was recorded: layers were monitored)."""
        n = self.signatures.number(STATS_STEPS)
        return bool(self.trace.layers) and (n is None or n > 0)

    @cached_property
    def grad_layers(self) -> list[str]:
        """Monitored layers that own parameters (where gradient events can occur), forward order;
        none when no parameter gradient was measured on any checked step."""
        if not self.watched or self.signatures.number(GRAD_STEPS) == 0:
            return []
        return [li.name for li in sorted(self.trace.layers, key=lambda x: x.index) if li.n_params > 0]

    def unwatched(self, otherwise: str, gradients: bool = False) -> "Reading":
        """The unobserved reading of a node that reads layer statistics (``gradients``: parameter
        gradients) when there were none: a gap when layers were there but nothing reached the
        detectors, else ``otherwise``."""
        from neuraldbg.causal.structure import Reading

        if self.trace.layers and self.signatures.number(STATS_STEPS) == 0:
            return Reading(None, reason="no layer statistics reached the monitor on any checked step", gap=True)
        if gradients:
            why = unsupported(self.signatures)
            if why:
                return Reading(None, reason=why, gap=True)
            has_params = any(li.n_params for li in self.trace.layers)
            if self.watched and self.signatures.number(GRAD_STEPS) == 0 and has_params:
                return Reading(None, reason="no parameter gradient was measured on any checked step", gap=True)
        return Reading(None, reason=otherwise)

    @cached_property
    def layer_types(self) -> set[str]:
        """The module class names of the monitored layers."""
        return {li.type for li in self.trace.layers}

    def near(self, a: Event, b: Event, layers: int, steps: int) -> bool:
        """Same or nearby layer (at most ``layers`` apart in forward order) and overlapping step
        spans (within ``steps``)."""
        ia, ib = self.trace.layer_index(a.layer), self.trace.layer_index(b.layer)
        if ia is None or ib is None or abs(ia - ib) > layers:
            return False
        return a.step <= b.end_step + steps and b.step <= a.end_step + steps
