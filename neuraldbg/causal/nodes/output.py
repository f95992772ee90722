"""Whether the model's output still depends on its input: its spread across the batch.

A run that learns only a constant -- the mean of its targets, the class prior -- has an output
that no longer varies from one sample to the next. Nothing in the loss says so: the constant is
learned, so the loss falls from its start, and a regression has no chance level to read it
against. The spread says it directly: on checked steps the monitor reduces the model's output to
its standard deviation across the batch (mean over the output's other entries) and its RMS
(``neuraldbg/monitor/measurements/output_spread.py``), over the first and the last
``OUTPUT_WINDOW`` checked steps.

Cut points (reasoning in ``docs/causal_model.md``): the output has *collapsed* when both hold at
the end of the run --

* ``COLLAPSE_CV`` -- the spread is under this share of the output's RMS. Healthy runs of both
  suites end at 0.83..0.98; a loss that can be met only by a constant ends under 0.004, a width-1
  bottleneck at 0.
* ``COLLAPSE_DROP`` -- and it fell under this share of its first checked steps: a collapse is
  learned. An output that never varied (a deep stack of sigmoids whose signal decays from
  initialization) or that the run never moved (a learning rate too low) did not collapse.
  Healthy runs end at 2.4..110x their first spread; collapsed ones at 0..0.07x.

Families whose objective is a game (``non_monotone``: a GAN's discriminator at equilibrium, an RL
value head) leave it unobserved.
"""
from __future__ import annotations

from neuraldbg.causal.structure import NoisyMax, Reading
from neuraldbg.causal.view import TraceView
from neuraldbg.trace import Signature
from neuraldbg.vocab import has_trait

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 32

#: checked steps at each end of the run whose output spread is kept (medians over them)
OUTPUT_WINDOW = 5
COLLAPSE_CV = 0.05
COLLAPSE_DROP = 0.3

OUTPUT_CV = Signature("output_cv", "number", "run", "max",
                      "the model output's spread across the batch over its RMS, median of the last checked steps",
                      lo=0)
OUTPUT_SPREAD_DROP = Signature("output_spread_drop", "number", "run", "max",
                               "the model output's spread across the batch at the last checked steps over the "
                               "first ones (medians)", lo=0)

SIGNATURES = (OUTPUT_CV, OUTPUT_SPREAD_DROP)


def collapse_state(cv: float, drop: float) -> str:
    """``"present"`` when the output's spread ended under ``COLLAPSE_CV`` of its RMS and under
    ``COLLAPSE_DROP`` of its first checked steps, else ``"absent"``. Pure."""
    return "present" if cv < COLLAPSE_CV and drop < COLLAPSE_DROP else "absent"


def output_collapse(view: TraceView) -> Reading | None:
    """Whether the model's output stopped depending on its input (see the module docstring)."""
    trace = view.trace
    if has_trait(trace.family, "non_monotone"):
        return Reading(None, reason=f"a {trace.family} output follows a game: a constant one can be its equilibrium")
    cv, drop = view.signatures.number(OUTPUT_CV), view.signatures.number(OUTPUT_SPREAD_DROP)
    if cv is None or drop is None:
        return Reading(None, reason=view.signatures.gap(OUTPUT_CV) or "the model's output spread was not measured")
    state = collapse_state(cv, drop)
    if state == "present":
        note = (f"the model's output no longer depends on its input (its spread across the batch is {cv:.2g}x its "
                f"size, {drop:.2g}x what it was at the start)")
    else:
        note = f"the model's output varies across the batch ({cv:.2g}x its size, {drop:.2g}x its start)"
    return Reading(state, (), note)


NODES = (
    NoisyMax(
        "output_collapse", ("absent", "present"),
        leak={"present": 0.005},
        effects={
            "unexplained=not_learning": {"present": 0.6},
            "instability=training": {"present": 0.15},
            "instability=init": {"present": 0.05},
            "signal_decay=depth": {"present": 0.05},
            "signal_decay=uniform": {"present": 0.05},
            "corruption=targets": {"present": 0.1},
            "data=shifted": {"present": 0.1},
            "training_loop=stale_gradients": {"present": 0.05},
        },
        why="A run whose output stopped varying across the batch has learned a constant and nothing of its "
            "input: what no modeled cause explains (the 'unexplained' leak), or a network that updates killed "
            "(dead units after too large a step or on shifted inputs, a decaying signal that reached the "
            "output late). A rate too low leaves the output as it was, so it does not collapse it.",
        extract=output_collapse,
    ),
)
