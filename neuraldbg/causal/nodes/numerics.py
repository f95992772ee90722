"""Numbers that leave their precision: where the first non-finite value was born, and updates
that round away in low-precision weights -- the evidence of the ``numerics`` root.

A NaN that comes in with the data and a NaN the run makes itself are different faults with
different fixes. The first non-finite value of a run has a *birthplace*, one of, in the order a
step makes them (:data:`ORIGINS`):

* ``input`` -- the model's input batch (a ``data_anomaly`` event at the input, ``at_input``);
* ``forward`` -- a layer's output, the inputs finite (a ``data_anomaly`` event born inside);
* ``targets`` -- the loss, every input and output finite (a NaN target; read by
  ``target_fault``, ``neuraldbg/causal/nodes/data.py``);
* ``backward`` -- the gradients, while the forward and the loss of that step were finite
  (``nonfinite_grad_step``; a step a ``GradScaler`` skips is its design, not a birth);
* ``update`` -- the weights, finite through a whole step and non-finite after its optimizer
  update (``nonfinite_weights_step``: the first checked step whose forward ran on weights an
  update had just made non-finite; an Adam ``eps`` that rounds to zero in fp16, ``eps=0``).

Data can be the origin only of the first and third kinds; the others are the run's own numbers
(:func:`birthplace`). The measurements are in ``neuraldbg/monitor/measurements/numerics.py``
(the dtype census, the gradients' and the weights' finiteness) and
``neuraldbg/monitor/measurements/step_size.py`` (the share of updates lost).

Nodes:

* ``weights_precision`` -- "half" when most trainable elements are held in a 16-bit float
  (``weights_dtype``: ``float16`` or ``bfloat16``), "full" otherwise. A model under autocast
  keeps fp32 master weights: "full".
* ``update_lost`` -- "lost" when, over the step-size window, the median share of weight-matrix
  elements with a non-zero gradient that the update left bit-for-bit unchanged is at least
  ``LOST_SHARE`` (``update_lost_share``); "moved" otherwise. Observed only on half-precision
  weights: in fp32 an update below the weights' resolution is a gradient too small to matter,
  which the gradient evidence reads.

Cut points (reasoning in ``docs/causal_model.md``):

* ``LOST_SHARE`` -- a half. An Adam step moves each element by about the rate; it rounds away
  when the rate is below half a unit in the last place of the weight, ``|w| x 2^-9`` in bf16
  (8 significant bits). At AdamW 3e-5 on bf16 weights of scale 0.02..0.05 about 9 elements in
  10 never move; a healthy fp32 or bf16-with-master-weights run loses none, and pure bf16 at a
  rate that clears the resolution loses the few elements far above the typical scale.
"""
from __future__ import annotations

from neuraldbg.causal.structure import Precondition, Reading, Table
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import DATA
from neuraldbg.trace import Signature

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 25

LOST_SHARE = 0.5
#: where a non-finite value can be born, in the order one step makes them
ORIGINS = ("input", "forward", "targets", "backward", "update")
#: 16-bit float dtypes whose resolution an update can fall below
HALF_DTYPES = frozenset({"float16", "bfloat16"})

WEIGHTS_DTYPE = Signature("weights_dtype", "text", "entry", "lead",
                          "the floating dtype holding most of the trainable parameters' elements (float32, "
                          "bfloat16, float16...)")
UPDATE_LOST_SHARE = Signature("update_lost_share", "number", "window", "median",
                              "median over the step-size window of the share of weight-matrix elements with a "
                              "non-zero gradient that the optimizer's update left unchanged", lo=0, hi=1)
NONFINITE_GRAD_STEP = Signature("nonfinite_grad_step", "integer", "run", "min",
                                "the first checked step whose gradients were non-finite (steps a GradScaler "
                                "skips excepted)", lo=0)
NONFINITE_WEIGHTS_STEP = Signature("nonfinite_weights_step", "integer", "run", "min",
                                   "the first checked step whose forward ran on weights that the update before "
                                   "it turned non-finite (finite before that update)", lo=0)

SIGNATURES = (WEIGHTS_DTYPE, UPDATE_LOST_SHARE, NONFINITE_GRAD_STEP, NONFINITE_WEIGHTS_STEP)


def birthplace(first: dict[str, int | None]) -> tuple[str, int] | None:
    """``(origin, step)`` of the first non-finite value from the first step each origin of
    :data:`ORIGINS` showed one (``None``: never); ties go to the origin earlier in a step (a
    NaN input makes the forward, the loss and the gradients non-finite in the same step).
    ``update`` counts at the step whose forward first ran on the non-finite weights, so it
    wins a tie with ``forward`` there: those weights were born before that forward. ``None``
    when no origin saw one. Pure."""
    rank = {o: i for i, o in enumerate(ORIGINS)}
    rank["update"] = rank["forward"] - 0.5  # before the forward of the step it is dated at
    seen = [(s, rank[o], o) for o, s in first.items() if s is not None]
    if not seen:
        return None
    s, _, o = min(seen)
    return o, s


def weights_precision_state(dtype: str | None) -> str | None:
    """'half' for a 16-bit float dtype name, 'full' for another, ``None`` unmeasured. Pure."""
    if not dtype:
        return None
    return "half" if dtype in HALF_DTYPES else "full"


def update_lost_state(share: float | None) -> str | None:
    """'lost' at ``LOST_SHARE`` and above, 'moved' below, ``None`` unmeasured. Pure."""
    if share is None:
        return None
    return "lost" if share >= LOST_SHARE else "moved"


def first_nonfinite(view: TraceView) -> tuple[str, int] | None:
    """:func:`birthplace` of the run in ``view``, read once per view."""
    return view.memo("birthplace", _first_nonfinite)


def _first_nonfinite(view: TraceView) -> tuple[str, int] | None:
    trace, sigs = view.trace, view.signatures
    firsts: dict[str, int | None] = {o: None for o in ORIGINS}
    nan = view.of_kind(DATA, "nan", "inf")
    if nan:
        e = view.first(nan)
        at_input = e.measured.get("at_input")
        inside = (at_input == 0.0) if at_input is not None else (trace.layer_index(e.layer) not in (0, None))
        firsts["forward" if inside else "input"] = e.step
    firsts["targets"] = trace.loss.first_nonfinite_step
    for origin, sig in (("backward", NONFINITE_GRAD_STEP), ("update", NONFINITE_WEIGHTS_STEP)):
        v = sigs.number(sig)
        firsts[origin] = int(v) if v is not None else None
    return birthplace(firsts)


def weights_precision(view: TraceView) -> Reading | None:
    """The precision the trainable weights are held in."""
    dtype = view.signatures.value(WEIGHTS_DTYPE)
    state = weights_precision_state(dtype)
    if state is None:
        return view.unmeasured(WEIGHTS_DTYPE, "the trainable parameters' dtype was not read")
    return Reading(state, (), f"trainable weights held in {dtype}")


def update_lost(view: TraceView) -> Reading | None:
    """Whether the first updates of half-precision weights rounded away."""
    sigs = view.signatures
    dtype = sigs.value(WEIGHTS_DTYPE)
    if weights_precision_state(dtype) != "half":
        return Reading(None, reason=(f"weights in {dtype}: an update below their resolution is a gradient too "
                                     "small to matter, which the gradient evidence reads") if dtype
                       else "the trainable parameters' dtype was not read")
    share = sigs.number(UPDATE_LOST_SHARE)
    state = update_lost_state(share)
    if state is None:
        return view.unmeasured(UPDATE_LOST_SHARE, "no update of a weight matrix was measured")
    return Reading(state, (), f"{share:.0%} of the {dtype} weight elements with a gradient were left unchanged by "
                              "the update (median over the first measured steps)")


NODES = (
    Table(
        "weights_precision", ("full", "half"), parents=("numerics",),
        rows=(
            ({"numerics": "updates_lost"}, (0.01, 0.99)),
            ({"numerics": "overflow"}, (0.55, 0.45)),
            ({}, (0.95, 0.05)),
        ),
        why="The dtype the trainable weights are held in: 'half' for fp16 or bf16 (a model "
            "converted with .half() or .to(torch.bfloat16)), 'full' for fp32 (autocast keeps fp32 "
            "master weights). Lost updates need half-precision weights; overflow is far more "
            "common in fp16 (largest value 65504) than in fp32, but an optimizer's 0/0 (eps=0) "
            "overflows in any dtype. Most healthy runs train fp32 weights, some pure bf16.",
        extract=weights_precision,
    ),
    Table(
        "update_lost", ("moved", "lost"), parents=("learning_rate", "numerics"),
        rows=(
            ({"numerics": "updates_lost"}, (0.05, 0.95)),
            ({"learning_rate": "too_low"}, (0.85, 0.15)),
            ({}, (0.99, 0.01)),
        ),
        why="Observed on half-precision weights only: the median share of weight elements with a "
            "non-zero gradient that the update left unchanged, over the first measured steps. "
            "Updates below half a unit in the last place round away (a bf16 weight of 0.03 moves "
            "only by steps above about 6e-5), whatever the optimizer intended. A rate too low for "
            "the task loses them too when the weights are bf16, but a rate that would be sound in "
            "fp32 losing them is the precision's fault: the fix is fp32 master weights, not a "
            "larger rate.",
        extract=update_lost,
    ),
)


def lacks_half_weights(view: TraceView) -> str | None:
    """Why the run cannot lose updates to rounding (``None``: it can, or could not tell)."""
    dtype = view.signatures.value(WEIGHTS_DTYPE)
    if weights_precision_state(dtype) == "full":
        return f"the trainable weights are {dtype}, whose resolution no sound update falls below"
    return None


def lacks_own_nonfinite(view: TraceView) -> str | None:
    """Why the run shows no value that left its range (``None``: it shows one, or could not
    tell): no non-finite value anywhere, or the first one came in with the input batch."""
    born = first_nonfinite(view)
    if born is None:
        return "no NaN or Inf anywhere in the run" if view.watched else None
    if born[0] == "input":
        return f"the first non-finite value came in with the input batch (step {born[1]})"
    return None


PRECONDITIONS = (
    Precondition(
        "numerics", "updates_lost", "weights held in a 16-bit float", lacks_half_weights,
        why="An update rounds away only where the weights' resolution is coarse: fp16 or bf16 weights without "
            "fp32 master copies.",
    ),
    Precondition(
        "numerics", "overflow", "a non-finite value the run made itself", lacks_own_nonfinite,
        why="Overflow shows as what it is: a NaN or Inf born in a layer, the loss, the gradients or the update "
            "while the inputs were finite.",
    ),
)
