"""What the monitor cannot measure in this model: parameters of an unsupported tensor type.

Statistics, the weight census and the step size read plain dense tensors and the local shards of
sharded ``DTensor`` parameters (FSDP2, ``neuraldbg/monitor/stats.py``: ``measurable``); a parameter
whose data is any other tensor subclass (a quantized or wrapper type, a DTensor over such a type)
is left out of all of them. This measurement counts those parameters on entry, so that the diagnosis says what
it did not see (``unsupported_params``, ``unsupported_type``) instead of reading the absence of
their events as a healthy sign.
"""
from __future__ import annotations

from typing import Any

from neuraldbg.causal.nodes.run import UNSUPPORTED_PARAMS, UNSUPPORTED_TYPE
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.stats import measurable


@register_measurement
class Coverage(Measurement):
    """Parameters the monitor does not measure, and their type."""

    signatures = (UNSUPPORTED_PARAMS, UNSUPPORTED_TYPE)

    def __init__(self) -> None:
        self.count = 0
        self.types: list[str] = []

    def enter(self, ctx: AddonContext) -> None:
        """Count the parameters whose data is a tensor subclass the statistics do not read."""
        seen: set[int] = set()
        for p in ctx.root.parameters():
            if id(p) not in seen and not measurable(p):
                seen.add(id(p))
                self.count += 1
                name = type(p.data).__name__
                if name not in self.types:
                    self.types.append(name)

    def summary(self) -> dict[Any, Any]:
        """The count (0 when every parameter is measured) and the first unsupported type."""
        out: dict[Any, Any] = {UNSUPPORTED_PARAMS: self.count}
        if self.types:
            out[UNSUPPORTED_TYPE] = ", ".join(self.types)
        return out
