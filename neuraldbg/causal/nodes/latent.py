"""The latent mechanisms: never observed, they carry what several symptoms have in common.

When a run blows up, gradients explode, units die, the loss diverges and NaNs appear, all
because of one mechanism; hanging those symptoms off ``instability`` counts that one fact once
(``docs/causal_model.md``, "Why latent mechanisms"). ``signal_decay`` plays the same role for
vanishing gradients, saturation and a flat loss. ``corruption`` splits corrupted data into the
two ways it shows: non-finite values (a NaN input, a NaN loss) or targets that stop matching
their inputs (a return to chance, a stall), which share no symptom. Numbers are hand-set; the
reasoning for each is in ``docs/causal_model.md``.
"""
from __future__ import annotations

from neuraldbg.causal.structure import NoisyMax

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 0

NODES = (
    NoisyMax(
        "corruption", ("none", "values", "targets"), latent=True,
        leak={"values": 0.001, "targets": 0.001},
        effects={"data=corrupted": {"values": 0.62, "targets": 0.37}},
        why="How corrupted data shows. 'values': non-finite numbers carried in by the data (a NaN "
            "or Inf input, a NaN target): NaN at the input, a non-finite loss, exploding "
            "gradients. 'targets': finite targets that stop matching their inputs (shuffled or "
            "misaligned labels): no NaN and no input shift, but a loss that goes back to chance "
            "or never leaves it. Under one 'corrupted' state their symptoms were conditionally "
            "independent, so a label fault's absent NaN counted against it as if NaN were "
            "expected of it.",
    ),
    NoisyMax(
        "instability", ("none", "training", "init"), latent=True,
        leak={"training": 0.01, "init": 0.002},
        effects={
            "learning_rate=too_high": {"training": 0.92},
            "initialization=too_large": {"init": 0.80, "training": 0.10},
            "data=shifted": {"training": 0.55},
            "corruption=values": {"training": 0.12},
            "architecture=unstable": {"training": 0.25, "init": 0.08},
            "training_loop=stale_gradients": {"training": 0.6},
        },
        why="Numerical blow-up. 'init': present from the first step, before any update could "
            "cause it (only weights, inputs and depth act then). 'training': appears after "
            "updates (step size) or after the inputs change.",
    ),
    NoisyMax(
        "signal_decay", ("none", "depth", "uniform"), latent=True,
        leak={"depth": 0.01, "uniform": 0.005},
        effects={
            "architecture=unstable": {"depth": 0.75},
            "initialization=too_small": {"uniform": 0.85, "depth": 0.05},
        },
        why="Signal too small to learn from. 'depth': the gradient shrinks layer by layer "
            "toward the input (saturating stacks, deep plain nets). 'uniform': every layer's "
            "signal is small because every weight is small.",
    ),
)
