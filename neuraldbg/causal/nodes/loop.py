"""The training loop's own bugs, each read from a direct signature (``training_loop``).

Measured by ``neuraldbg/monitor/measurements/loop.py`` on checked steps, without a host sync
per hook:

* ``stale_grads`` -- an optimizer stepped on gradients left from before its previous step
  (``zero_grad`` never called). Gradient accumulation (several backward passes, then a step,
  then ``zero_grad``) zeroes before the next step and stays quiet; so does a GAN whose
  discriminator's gradients from the generator's backward are zeroed before its own step.
* ``orphan_params`` -- trainable parameters that receive gradients but that no param group of
  any optimizer stepping the model holds (an optimizer built on part of the model, or a head
  replaced after the optimizer was made). Frozen parameters (``requires_grad=False``) are normal.
* ``detached`` -- parameters of a module whose forward ran in training, which require grad and
  which an optimizer holds, but which never received a gradient over the first checked steps
  while others did (``torch.no_grad()`` around a part of the model, an output ``.detach()``-ed).
  A module that never runs (an unused branch, an expert nothing routes to) is not detached.
* ``loss_input`` -- the model's output rows already lie in [0, 1] and sum to 1 (a softmax in
  front of a log-softmax loss), and the loss never goes below the floor of cross-entropy over
  softmaxed probabilities, ``ln(1 + (K - 1) / e)`` for ``K`` classes (a loss that does is not a
  cross-entropy over these probabilities: NLL on their log, a BCE...).

Cut points: ``STALE_MIN`` stale optimizer steps and at least ``STALE_SHARE`` of the examined ones
(a loop that zeroes by mistake only sometimes still reads); ``PROB_SHARE`` of the checked steps
with probability rows; the loss's low stays above ``FLOOR_MARGIN`` x the floor.
"""
from __future__ import annotations

import math

from neuraldbg.causal.nodes.run import OUT_FEATURES
from neuraldbg.causal.structure import NoisyMax, Precondition, Reading
from neuraldbg.causal.view import TraceView
from neuraldbg.trace import Signature

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 35

STALE_MIN = 2
STALE_SHARE = 0.25
PROB_SHARE = 0.9
FLOOR_MARGIN = 0.97

STALE_STEPS = Signature("stale_steps", "integer", "window", "max",
                        "checked optimizer steps taken on gradients left from before that optimizer's previous step",
                        lo=0)
STALE_CHECKED = Signature("stale_checked", "integer", "window", "min",
                          "checked optimizer steps examined for stale gradients", lo=0)
ORPHAN_PARAMS = Signature("orphan_params", "integer", "window", "max",
                          "trainable parameters that received gradients but are in no optimizer's param groups", lo=0)
ORPHAN_LAYER = Signature("orphan_layer", "text", "window", "lead", "the first layer holding such a parameter")
DETACHED_PARAMS = Signature("detached_params", "integer", "window", "max",
                            "optimized parameters of modules that ran but never received a gradient", lo=0)
DETACHED_LAYER = Signature("detached_layer", "text", "window", "lead", "the first layer holding such a parameter")
LOOP_CHECKED = Signature("loop_checked", "integer", "window", "min",
                         "checked steps with an optimizer step that the parameter checks examined", lo=0)
PROB_SHARE_SIG = Signature("output_probabilities", "number", "window", "min",
                           "share of checked steps whose model output rows were probability vectors", lo=0, hi=1)

SIGNATURES = (STALE_STEPS, STALE_CHECKED, ORPHAN_PARAMS, ORPHAN_LAYER, DETACHED_PARAMS, DETACHED_LAYER,
              LOOP_CHECKED, PROB_SHARE_SIG)


def stale_state(stale: float | None, checked: float | None) -> str | None:
    """'present' or 'absent' from the stale and examined optimizer steps (None: not measured)."""
    if stale is None or not checked:
        return None
    return "present" if stale >= STALE_MIN and stale >= STALE_SHARE * checked else "absent"


def softmax_floor(k: int) -> float:
    """The least cross-entropy a ``k``-way log-softmax reaches on softmaxed probabilities:
    ``ln(1 + (k - 1) / e)`` (one probability 1, the others 0, softmaxed again)."""
    return math.log(1 + (k - 1) / math.e)


def stale_grads(view: TraceView) -> Reading | None:
    """Whether optimizers stepped on stale gradients."""
    sigs = view.signatures
    stale, checked = sigs.number(STALE_STEPS), sigs.number(STALE_CHECKED)
    state = stale_state(stale, checked)
    if state is None:
        return view.unmeasured(STALE_STEPS, "no optimizer step was examined")
    return Reading(state, (), f"{int(stale)} of {int(checked)} examined optimizer steps ran on gradients left "
                              f"from before the previous step ({state})")


def _params_reading(view: TraceView, count_sig: Signature, layer_sig: Signature, what: str) -> Reading:
    sigs = view.signatures
    n, checked = sigs.number(count_sig), sigs.number(LOOP_CHECKED)
    if n is None or not checked:
        return view.unmeasured(count_sig, "no optimizer step was examined")
    if n < 1:
        return Reading("absent")
    layer = sigs.value(layer_sig)
    return Reading("present", (), f"{int(n)} parameters {what}" + (f", first in `{layer}`" if layer else ""))


def orphan_params(view: TraceView) -> Reading | None:
    """Trainable parameters with gradients that no optimizer holds."""
    return _params_reading(view, ORPHAN_PARAMS, ORPHAN_LAYER,
                           "receive gradients but are in no optimizer's param groups")


def detached(view: TraceView) -> Reading | None:
    """Optimized parameters of modules that ran but never received a gradient."""
    return _params_reading(view, DETACHED_PARAMS, DETACHED_LAYER,
                           "of modules that ran never received a gradient (cut off from the loss)")


def loss_input(view: TraceView) -> Reading | None:
    """What the loss is fed: logits, or rows that are already probabilities."""
    sigs = view.signatures
    share = sigs.number(PROB_SHARE_SIG)
    if share is None:
        return view.unmeasured(PROB_SHARE_SIG, "the model's output was not examined")
    if share < PROB_SHARE:
        return Reading("logits")
    k = sigs.number(OUT_FEATURES)
    low = view.trace.loss.min
    if k is not None and k >= 2 and low is not None and low < FLOOR_MARGIN * softmax_floor(int(k)):
        return Reading("logits", (), f"the output rows are probabilities, but the loss went below ln(1 + (K - 1)/e)"
                                     f" = {softmax_floor(int(k)):.3g}: it does not take them as logits")
    floor = f"; the loss stays above ln(1 + (K - 1)/e) = {softmax_floor(int(k)):.3g}" if k and k >= 2 else ""
    return Reading("probabilities", (), f"the model's output rows are probabilities (in [0, 1], summing to 1) "
                                        f"on {share:.0%} of checked steps{floor}")


def _present(cause: str, p: float) -> dict:
    return {f"training_loop={cause}": {"present": p}}


NODES = (
    NoisyMax(
        "stale_grads", ("absent", "present"), leak={"present": 0.001},
        effects=_present("stale_gradients", 0.95),
        why="An optimizer stepped on gradients left from before its previous step: the direct signature of a loop "
            "that never calls zero_grad. Exact by construction (the gradients' presence at a backward's start and "
            "the optimizer's steps), so the leak is small.",
        extract=stale_grads,
    ),
    NoisyMax(
        "orphan_params", ("absent", "present"), leak={"present": 0.002},
        effects=_present("params_not_in_optimizer", 0.95),
        why="Trainable parameters receive gradients but no optimizer holds them: the optimizer was built on part of "
            "the model, or a module was replaced after it was made.",
        extract=orphan_params,
    ),
    NoisyMax(
        "detached", ("absent", "present"), leak={"present": 0.002},
        effects=_present("graph_detached", 0.95),
        why="Optimized parameters of a module that ran never receive a gradient while others do: the module's "
            "output was cut from the loss (no_grad, detach).",
        extract=detached,
    ),
    NoisyMax(
        "loss_input", ("logits", "probabilities"), leak={"probabilities": 0.002},
        effects={"training_loop=loss_on_probabilities": {"probabilities": 0.95}},
        why="The model's output rows are already probabilities and the loss stays on the floor a log-softmax "
            "reaches on them: a softmax in front of CrossEntropyLoss.",
        extract=loss_input,
    ),
)


#: the monitor's reason for no output size when the loss is known not to be a cross-entropy
#: (``neuraldbg/monitor/measurements/output.py``)
NOT_CROSS_ENTROPY = ("the loss is not a cross-entropy (no negative log-likelihood in its autograd graph, or its "
                     "gradient into the model's output rows does not sum to zero): no chance level ln K")


def lacks_class_output(view: TraceView) -> str | None:
    """Why the run has no cross-entropy over two classes or more (``None``: it has one, or the
    monitor cannot tell): a softmax in front of the loss needs one to be a fault."""
    sigs = view.signatures
    k = sigs.number(OUT_FEATURES)
    if k is not None:
        return None if k >= 2 else f"the model's output has {int(k)} unit"
    return "the loss is not a cross-entropy" if sigs.gap(OUT_FEATURES) == NOT_CROSS_ENTROPY else None


PRECONDITIONS = (
    Precondition(
        "training_loop", "loss_on_probabilities", "a cross-entropy over a multi-class output", lacks_class_output,
        why="A softmax in front of CrossEntropyLoss is a fault of a classifier's loss; a regression head (one "
            "output, a mean-squared error) that learns slowly has no such loss to feed probabilities to.",
    ),
)
