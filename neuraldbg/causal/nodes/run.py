"""What the monitor records about the run itself: its settings, its output size, its rates.

No nodes here: these signatures are read by extractors in other modules (the check interval
decides what is "at init", the output size gives the chance level of a classifier's loss) and
by the hypotheses' sentences (the learning rates in a fix).
"""
from __future__ import annotations

import math

from neuraldbg.trace import Signature, Signatures

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 90

EVERY = Signature("every", "integer", "entry", "lead", "the monitor's check interval (every Nth step)", lo=1)
OPTIMIZER = Signature("optimizer", "text", "entry", "lead", "class name of the optimizer the monitor watched")
LR = Signature("lr", "numbers", "run", "lead", "the learning rate of each param group when the trace was taken")
LR_PEAK = Signature("lr_peak", "number", "run", "max", "the largest learning rate seen on a checked step", lo=0)
OUT_FEATURES = Signature("out_features", "integer", "entry", "lead",
                         "out_features of the last linear layer in forward order: the model's output size", lo=1)
MERGED_RANKS = Signature("merged_ranks", "integers", "run", "lead", "the ranks a merged trace was made of")

SIGNATURES = (EVERY, OPTIMIZER, LR, LR_PEAK, OUT_FEATURES, MERGED_RANKS)


def chance_loss(signatures: Signatures) -> float | None:
    """``ln K`` of the model's ``K``-way output (``None`` when unknown or ``K < 2``): the loss of a
    classifier that has learned nothing, a reference that does not depend on how training went."""
    k = signatures.number(OUT_FEATURES)
    return math.log(k) if k is not None and k >= 2 else None
