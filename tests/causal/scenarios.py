"""Hand-built traces shaped like what the monitor emits on the issue's seven scenarios.

The event lists mirror real traces of a 3-layer ReLU MLP (and a 20-layer sigmoid MLP) run
with the monitor: same kinds, layers, steps and measured values, so unit tests exercise the
engine on realistic input without training anything.
"""
from __future__ import annotations

import math

from neuraldbg.events.base import ACTIVATION, DATA, GRADIENT, OPTIMIZER, Event, make_event
from neuraldbg.trace import LayerInfo, Trace
from tests.tiny import loss_summary, make_trace  # noqa: F401  (loss_summary: re-exported for the tests)

STEPS = 60


def mlp_layers(depth: int = 3, act: str = "ReLU", width: int = 64) -> tuple[LayerInfo, ...]:
    """Linear/activation alternating, forward order, like ``nn.Sequential`` of an MLP."""
    out = []
    for i in range(depth):
        out.append(LayerInfo(name=str(len(out)), type="Linear", index=len(out), n_params=width * width + width))
        if i < depth - 1:
            out.append(LayerInfo(name=str(len(out)), type=act, index=len(out), n_params=0))
    return tuple(out)


def decreasing(n: int = STEPS, start: float = 0.71, end: float = 0.05) -> list[float]:
    """A healthy, noisy-free exponential decrease."""
    return [start * (end / start) ** (i / (n - 1)) for i in range(n)]


def flat(n: int = STEPS, level: float = 0.693) -> list[float]:
    """A loss that does not move (within 0.3%)."""
    return [level * (1 + 0.003 * math.sin(i)) for i in range(n)]


def trace(events, layers=None, losses=None, family: str = "mlp", steps: int = STEPS, sigs=None) -> Trace:
    """A trace over ``steps`` steps from step 0; ``sigs``: signatures by declared name."""
    return make_trace(events, mlp_layers() if layers is None else layers, losses, family=family, steps=steps,
                      sigs=dict(sigs or {}))


def grad(kind: str, layer: str, step: int, end: int | None = None, **values: float) -> Event:
    """A gradient-health event."""
    return make_event(GRADIENT, kind, layer, step, 5.0, values, end_step=end if end is not None else step)


def act(kind: str, layer: str, step: int, end: int | None = None) -> Event:
    """An activation-regime event."""
    return make_event(ACTIVATION, kind, layer, step, 0.9, {f"{'dead' if kind == 'dead' else 'sat'}_frac": 0.9},
                      end_step=end if end is not None else step)


def loss_event(kind: str, step: int, end: int | None = None, **values: float) -> Event:
    """An optimizer-instability (loss) event."""
    return make_event(OPTIMIZER, kind, None, step, 3.0, values, end_step=end if end is not None else step)


def data(kind: str, layer: str, step: int, end: int | None = None, **values: float) -> Event:
    """A data-anomaly event."""
    return make_event(DATA, kind, layer, step, 6.0, values, end_step=end if end is not None else step)


# ---- the scenarios ----------------------------------------------------------------

def healthy() -> Trace:
    return trace([], losses=decreasing())


def lr_too_high() -> Trace:
    ev = [grad("exploding", "0", 2, 5, grad_rms=157.0, out_rms=25.9),
          grad("exploding", "2", 2, 7, grad_rms=67.0, out_rms=1765.0),
          grad("exploding", "4", 2, 7, grad_rms=217.0, out_rms=2.4e5),
          act("dead", "3", 4, 59),
          loss_event("divergence", 5, 8, window_median=3e10),
          grad("vanishing", "0", 6, 59, grad_rms=0.0, out_rms=5e14),
          grad("vanishing", "2", 6, 59, grad_rms=0.0, out_rms=float("nan"))]
    losses = [0.71, 12.9, 2.5e5, 3e10, 1.8e12, 1.2e21] + [20.0 + (i % 7) for i in range(STEPS - 6)]
    return trace(ev, losses=losses)


def init_too_small() -> Trace:
    ev = [grad("vanishing", "0", 0, 59, grad_rms=0.0, out_rms=0.0006, ratio_to_max=0.0),
          grad("vanishing", "2", 0, 59, grad_rms=0.0, out_rms=0.0001, ratio_to_max=0.0001),
          loss_event("plateau", 49, 59, relative_improvement=0.0007)]
    return trace(ev, losses=flat())


def init_too_large() -> Trace:
    ev = [grad("exploding", "4", 0, 1, grad_rms=58.8, out_rms=3581.0),
          grad("exploding", "0", 1, 1, grad_rms=11.0, out_rms=18.3),
          grad("exploding", "2", 1, 1, grad_rms=14.9, out_rms=257.0),
          act("dead", "3", 8, 59),
          grad("vanishing", "0", 22, 22, grad_rms=0.0, out_rms=24.9),
          grad("vanishing", "2", 22, 22, grad_rms=0.0, out_rms=2142.0)]
    losses = [3378.0, 19208.0, 601.0, 100.0, 69.0, 137.0, 30.0, 34.0, 11.5, 28.9] + \
        [0.69 * (1 + 0.02 * math.sin(i)) for i in range(STEPS - 10)]
    return trace(ev, losses=losses)


def nan_batch(step: int = 30) -> Trace:
    ev = [data("nan", "0", step, 59, at_input=1.0, nan_count=320.0, fraction=0.25),
          loss_event("divergence", step, 59, nonfinite=1.0, loss=float("nan"))]
    losses = decreasing(step) + [float("nan")] * (STEPS - step)
    return trace(ev, losses=losses)


def nan_inside(step: int = 12) -> Trace:
    """A NaN born inside (overflow in layer 2 after gradients grew), not carried in by the data."""
    ev = [grad("exploding", "2", step - 3, step - 1, grad_rms=5e3),
          grad("exploding", "4", step - 2, step - 1, grad_rms=2e4),
          data("nan", "2", step, 59, at_input=0.0),
          loss_event("divergence", step, 59, nonfinite=1.0)]
    losses = decreasing(step) + [float("nan")] * (STEPS - step)
    return trace(ev, losses=losses)


def nan_sudden(step: int = 40) -> Trace:
    """A NaN born inside a calm run (an all-masked attention row of a malformed sample)."""
    ev = [data("nan", "2", step, 59, at_input=0.0),
          loss_event("divergence", step + 1, 59, nonfinite=1.0)]
    losses = decreasing(step + 1) + [float("nan")] * (STEPS - step - 1)
    return trace(ev, losses=losses)


def data_shift(step: int = 30) -> Trace:
    ev = [grad("exploding", "0", step, step + 3, grad_rms=6.5, baseline_rms=0.0024),
          grad("exploding", "2", step, step + 3, grad_rms=3.6, baseline_rms=0.0026),
          grad("exploding", "4", step, step + 3, grad_rms=11.0, baseline_rms=0.0195),
          loss_event("spike", step, step + 3, robust_z=27.0),
          data("shift", "0", step, 59, scale_ratio=982.0, mean_z=14.0),
          loss_event("divergence", step + 2, step + 5),
          grad("vanishing", "0", step + 4, 51, grad_rms=0.0, out_rms=3.8e6),
          grad("vanishing", "2", step + 4, 51, grad_rms=0.0, out_rms=1e12),
          act("dead", "3", step + 4, 59)]
    losses = decreasing(step) + [30.0 + i for i in range(STEPS - step)]
    return trace(ev, losses=losses)


def sigmoid_stack(depth: int = 20) -> Trace:
    layers = mlp_layers(depth, act="Sigmoid", width=32)
    linear = [li.name for li in layers if li.type == "Linear"]
    ev = [grad("vanishing", name, 0, 59, grad_rms=1e-9, out_rms=0.3, ratio_to_max=1e-5) for name in linear[:17]]
    ev.append(loss_event("plateau", 55, 59, relative_improvement=0.008))
    return trace(ev, layers=layers, losses=[0.78, 0.73, 0.70] + flat(STEPS - 3, 0.69))


def lr_too_low() -> Trace:
    return trace([loss_event("plateau", 49, 59, relative_improvement=0.004)], losses=flat())


#: scenario -> (builder, expected top-1 (cause, state) or None for healthy)
SCENARIOS = {
    "healthy": (healthy, None),
    "lr_too_high": (lr_too_high, ("learning_rate", "too_high")),
    "lr_too_low": (lr_too_low, ("learning_rate", "too_low")),
    "init_too_small": (init_too_small, ("initialization", "too_small")),
    "init_too_large": (init_too_large, ("initialization", "too_large")),
    "nan_batch": (nan_batch, ("data", "corrupted")),
    "data_shift": (data_shift, ("data", "shifted")),
    "sigmoid_stack": (sigmoid_stack, ("architecture", "unstable")),
}
