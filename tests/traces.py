"""Pieces of hand-made traces, for tests that need a session without training one."""
import math

from neuraldbg.trace import LayerInfo, LossSummary


def small_layers():
    """A Linear-ReLU-Linear model's layers, in forward order."""
    return (LayerInfo("fc1", "Linear", 0, 2080), LayerInfo("act1", "ReLU", 1, 0), LayerInfo("fc2", "Linear", 2, 130))


def loss_summary(values):
    """The loss summary of a curve (``values``, one per step; NaN and Inf count as non-finite)."""
    finite = [v for v in values if math.isfinite(v)]
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    return LossSummary(n=len(values), first=values[0], last=values[-1], min=min(finite), n_nonfinite=len(bad),
                       first_nonfinite_step=bad[0] if bad else None, history=tuple(enumerate(values)))
