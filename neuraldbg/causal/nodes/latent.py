"""The latent mechanisms: never observed, they carry what several symptoms have in common.

When a run blows up, gradients explode, units die, the loss diverges and NaNs appear, all
because of one mechanism; hanging those symptoms off ``instability`` counts that one fact once
(``docs/causal_model.md``, "Why latent mechanisms"). ``signal_decay`` plays the same role for
vanishing gradients, saturation and a flat loss. Numbers are hand-set; the reasoning for each
is in ``docs/causal_model.md``.
"""
from __future__ import annotations

from neuraldbg.causal.structure import NoisyMax

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 0

NODES = (
    NoisyMax(
        "instability", ("none", "training", "init"), latent=True,
        leak={"training": 0.01, "init": 0.002},
        effects={
            "learning_rate=too_high": {"training": 0.92},
            "initialization=too_large": {"init": 0.80, "training": 0.10},
            "data=shifted": {"training": 0.55},
            "data=corrupted": {"training": 0.10},
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
