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
UNOBSERVED_RANKS = Signature("unobserved_ranks", "text", "run", "lead",
                             "ranks of a job merged live whose trace did not arrive at exit, and from which step "
                             "on they are unobserved (their last autosave, if any, was merged)")
UNSUPPORTED_PARAMS = Signature("unsupported_params", "integer", "entry", "max",
                               "parameters of a tensor type the monitor does not measure (a tensor subclass)", lo=0)
UNSUPPORTED_TYPE = Signature("unsupported_type", "text", "entry", "lead", "the type names of those parameters")
STATS_STEPS = Signature("stats_steps", "integer", "run", "min",
                        "checked steps whose layer statistics reached the detectors", lo=0)
GRAD_STEPS = Signature("grad_steps", "integer", "run", "min",
                       "checked steps on which parameter gradients were measured", lo=0)
STARTED_TRAINED = Signature("started_trained", "text", "entry", "lead",
                            "why the monitor holds that the run did not start at initialization (resumed, loaded "
                            "or pre-trained weights)")

SIGNATURES = (EVERY, OPTIMIZER, LR, LR_PEAK, OUT_FEATURES, MERGED_RANKS, UNOBSERVED_RANKS, UNSUPPORTED_PARAMS,
              UNSUPPORTED_TYPE, STATS_STEPS, GRAD_STEPS, STARTED_TRAINED)


def unsupported(signatures: Signatures) -> str | None:
    """Why some parameters were not measured (their tensor type), or ``None`` when all were."""
    n = signatures.number(UNSUPPORTED_PARAMS)
    if not n:
        return None
    return f"{int(n)} parameters are {signatures.value(UNSUPPORTED_TYPE) or 'tensor-subclass'} tensors, a type the " \
           "monitor does not measure"


def started_trained(signatures: Signatures) -> str | None:
    """Why the monitor holds that the run was entered on trained weights (the ``started_trained``
    signature: a resume, a loaded state_dict, a pre-trained model), or ``None`` when, as far as it
    knows, the run started at initialization."""
    why = signatures.value(STARTED_TRAINED)
    return str(why) if why else None


def not_at_init(why: str, what: str) -> str:
    """The reason a first-step reading is unobserved on a run entered on trained weights: the
    monitor's ``why`` (:func:`started_trained`) and ``what`` the reading would have said. Pure."""
    detail = why.removeprefix("not at initialization: ").strip()
    return f"not at initialization: the run was entered on trained weights ({detail}); {what}"


def chance_loss(signatures: Signatures) -> float | None:
    """``ln K`` of the model's ``K``-way output (``None`` when unknown or ``K < 2``): the loss of a
    classifier that has learned nothing, a reference that does not depend on how training went."""
    k = signatures.number(OUT_FEATURES)
    return math.log(k) if k is not None and k >= 2 else None
