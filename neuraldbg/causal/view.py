"""A trace as the extractors read it: its events by kind, its layers, its check interval, memos.

Every evidence node's extractor (``neuraldbg/causal/nodes/``) receives one :class:`TraceView`
per extraction. The view computes the facts several extractors share once (the events of a
kind, the parameter layers, whether a step is "at init") and memoizes readings one extractor
needs from another (the loss pattern, say).
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Callable

from neuraldbg.causal.nodes.run import EVERY
from neuraldbg.events.base import Event
from neuraldbg.trace import Trace
from neuraldbg.vocab import has_trait

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
        """Whether detectors ran on layers (absence of a layer event is then evidence)."""
        return bool(self.trace.layers)

    @cached_property
    def grad_layers(self) -> list[str]:
        """Monitored layers that own parameters (where gradient events can occur), forward order."""
        return [li.name for li in sorted(self.trace.layers, key=lambda x: x.index) if li.n_params > 0]

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
