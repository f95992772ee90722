"""The model's output size: ``out_features`` of the last linear layer in forward order.

It gives the chance level ``ln K`` of a ``K``-way classifier (``neuraldbg/causal/nodes/run.py``),
a loss reference that does not depend on how well training went.
"""
from __future__ import annotations

from typing import Any, Iterable

from neuraldbg.causal.nodes.loop import NOT_CROSS_ENTROPY
from neuraldbg.causal.nodes.run import OUT_FEATURES
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement


def last_out_features(order: Iterable[str], modules: dict[str, Any]) -> int | None:
    """``out_features`` of the last linear layer in forward order: the model's output size."""
    for name in reversed(list(order)):
        k = getattr(modules.get(name), "out_features", None)
        if isinstance(k, int) and not isinstance(k, bool):
            return k
    return None


@register_measurement
class OutputSize(Measurement):
    """``out_features``, read from the forward order as far as the monitor has seen it."""

    signatures = (OUT_FEATURES,)

    def __init__(self) -> None:
        self._ctx: AddonContext | None = None

    def enter(self, ctx: AddonContext) -> None:
        """Keep the context: the forward order is known only once the model ran."""
        self._ctx = ctx

    def summary(self) -> dict[Any, Any]:
        """The output size, once a linear layer ran; none when the loss is known not to be a
        cross-entropy: ``out_features`` sets chance level ``ln K``, which means nothing for a
        regression head of ``K`` outputs (a DQN's action values), whose loss would read stalled."""
        if self._ctx is None or self._ctx.loss_is_cross_entropy is False:
            return {}
        k = last_out_features(self._ctx.order, dict(self._ctx.modules))
        return {} if k is None or k < 1 else {OUT_FEATURES: k}

    def gaps(self) -> dict[Any, str]:
        """Why no output size: the loss is not a cross-entropy."""
        if self._ctx is not None and self._ctx.loss_is_cross_entropy is False:
            return {OUT_FEATURES: NOT_CROSS_ENTROPY}
        return {}
