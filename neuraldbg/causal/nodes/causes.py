"""The root causes' own signatures: the step size, the initial weight scale, what a fine-tune kept.

The symptom nodes read what a failure *looks like*; these read what each cause *is*, measured
directly, so they hold on models whose symptoms look different from the zoo's:

* ``step_size`` -- the update-to-weight ratio ``||w_after - w_before|| / ||w_before||`` the
  optimizer took over its first measured steps, read at the run's peak learning rate
  (``step_ratio_median``: the median layer; ``step_ratio_max``: the fastest layer; measured by
  ``neuraldbg/monitor/measurements/step_size.py``). The signature of ``learning_rate``.
* ``init_scale`` -- the weights' RMS on entry against the nearest reference scale of their type
  and fan-in (``init_scale_log10``: the median over weight matrices of ``log10(rms / reference)``).
  For low-rank adapters (LoRA) the reference is zero: ``adapter_ratio`` is the median over
  adapters of ``||B A|| / ||W||``. The signature of ``initialization``.
* ``retention`` -- with a reference loss (``NeuralDbg(..., reference=fn)``: a held-out batch of
  the task a fine-tune must keep), the share of its pre-trained margin to chance that the run
  gave up: ``(tail - first) / (ln K - first)`` from the value on entry to the median of the last
  quarter of the values.

Cut points (reasoning in ``docs/causal_model.md``):

* ``STEP_TINY``/``STEP_LARGE`` -- healthy runs of both suites take 0.005..0.1 per step (the median
  layer; the fastest layer 0.008..0.13), SGD and Adam alike. Below ``STEP_TINY`` in *every*
  layer the weights cannot move measurably in thousands of steps; above ``STEP_LARGE`` in the
  median layer every step rewrites a fifth of each weight matrix. Between ``STEP_ELEVATED`` and
  ``STEP_LARGE`` is "elevated": five times the textbook 1e-2, where small models with large
  learning rates still train but a fine-tune forgets and a GAN's players overshoot; weaker
  evidence, whose weight each family's fitted table decides. Below ``STEP_SMALL`` in every layer
  (half the slowest healthy run's fastest layer) but above ``STEP_TINY`` is "small": the weights
  move, too slowly to learn in a short run -- a learning rate 10-100x too low, or a fine-tune at
  a deliberately small rate (which then learns: ``progress`` tells the two apart).
* ``STEP_EXTREME`` -- "extreme": the median layer's largest update over the window
  (``step_ratio_peak``; the first updates, read at the peak rate) moves it by more than three
  quarters of its own norm in one step. Under Adam the first updates move each weight by about
  the rate, so the ratio is about the rate over the weights' RMS: the healthy runs of both suites
  reach at most 0.51 there (the zoo's small transformer at AdamW 1e-2 with weights of std 0.02),
  rates 100x too high 0.97..15 (a 4-layer ``nn.TransformerEncoder`` at 1e-1: 0.97 and 0.98, which
  a cut at one norm missed). 0.75 sits 1.5x above the boldest healthy run and under every rate
  100x too high; weights scaled by 1e-3 or blown up reach it too (0.81..1.24), whose own
  witness is ``init_scale``. Above ``STEP_LARGE`` the window's median no longer tells the two
  apart: weights blown up by the first steps shrink the later ratios (a 100x rate settles at
  0.2..0.5, where a small model at a bold healthy rate sits too).
* ``INIT_LOG10_CUT`` -- healthy models of both suites sit within 0.05 (log10) of a reference
  scale; ``0.5`` is a factor of 3.2 off *every* reference of the layer, ten times that band.
* ``ADAPTER_LARGE`` -- LoRA zero-initializes ``B`` so fine-tuning starts at the pre-trained
  function (ratio exactly 0, as in every healthy adapter of both suites); an adapter that starts
  at half the norm of the layer it adapts has replaced a large part of it at step 0.
* ``CONFIG_RANGE_FACTOR`` -- a model config's ``initializer_range`` is a reference scale only
  within a factor 10 of the libraries' convention 0.02 (0.002..0.2; the transformer families
  ship 0.01..0.05): the config may hold the fault itself (an ``initializer_range`` x100), and
  trusting it would call the weights it made normal. Outside the band it is recorded
  (``config_init_range``) and named in ``init_scale``'s note.
* ``TRAINED_START`` -- weights off every reference read as a faulty initialization only when the
  model is at initialization: with the first loss below half of chance level ``ln K`` the model
  already knows its task (pre-trained, loaded or resumed: an untrained classifier starts near
  ``ln K``, a blown-up one far above), and ``init_scale`` is unobserved ("not at initialization").
  A monitor entered on a resumed run (optimizer state present, or ``at_init=False``) does not
  measure it at all, and a trace that says the run started trained (``started_trained``) never
  reads it, whatever scale it recorded (a rank merge, a hand-built trace): trained weights are no
  evidence about the initialization, and neither is anything else of the first step
  (``loss_start``, the layers' "init" phase: ``neuraldbg/causal/nodes/layers.py``).
* ``RETENTION_PARTIAL``/``RETENTION_LOST`` -- a quarter and a half of the margin between the
  reference's starting loss and chance: the zoo's healthy LoRA fine-tunes give up 0.10..0.17
  (15 runs), so "partial" is half again the top of that and "lost" means that half of what
  pre-training taught is gone. Without a chance level above the start (an unknown output size,
  a loss that is not a cross-entropy), the margin is the starting loss itself (lost: +50%).
"""
from __future__ import annotations

import math

from neuraldbg.causal.nodes.data import INPUT_RMS_MAX, input_scale_state
from neuraldbg.causal.nodes.run import OPTIMIZER, chance_loss, not_at_init, started_trained
from neuraldbg.causal.structure import Precondition, Reading, Table
from neuraldbg.causal.view import TraceView
from neuraldbg.trace import Signature
from neuraldbg.vocab import ROOTS

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 40

STEP_TINY = 1e-4
STEP_SMALL = 0.004
STEP_ELEVATED = 0.05
STEP_LARGE = 0.2
STEP_EXTREME = 0.75
INIT_LOG10_CUT = 0.5
ADAPTER_LARGE = 0.5
CONFIG_RANGE_FACTOR = 10.0
#: the std of transformer libraries' ``initializer_range`` convention (GPT-2, BERT, ViT, Llama)
CONFIG_RANGE_CONVENTION = 0.02
RETENTION_PARTIAL = 0.25
RETENTION_LOST = 0.5
#: a first loss below this share of chance level: the model already knows the task (trained)
TRAINED_START = 0.5
#: optimizer class-name parts of steps independent of the gradient's scale (scale_invariant)
ADAPTIVE_NAMES = ("adam", "adagrad", "adadelta", "adafactor", "rmsprop", "lamb", "lion", "sophia", "shampoo")
#: reference values below which retention is not read (the first one and a tail)
MIN_REFERENCE_POINTS = 3

STEP_RATIO_MEDIAN = Signature("step_ratio_median", "number", "window", "median",
                              "update/weight ratio per step of the median layer, median over the window, "
                              "read at the peak learning rate", lo=0)
STEP_RATIO_MAX = Signature("step_ratio_max", "number", "window", "max",
                           "update/weight ratio per step of the fastest layer, median over the window, "
                           "read at the peak learning rate", lo=0)
STEP_RATIO_PEAK = Signature("step_ratio_peak", "number", "window", "max",
                            "update/weight ratio per step of the median layer, largest over the window "
                            "(the first updates), read at the peak learning rate", lo=0)
STEP_RATIO_STEPS = Signature("step_ratio_steps", "integer", "window", "min", "optimizer steps measured", lo=0)
INIT_SCALE_LOG10 = Signature("init_scale_log10", "number", "entry", "median",
                             "median over weight matrices of log10(rms / nearest reference scale) on entry")
INIT_SCALE_N = Signature("init_scale_n", "integer", "entry", "lead", "weight matrices measured on entry", lo=0)
CONFIG_INIT_RANGE = Signature("config_init_range", "number", "entry", "lead",
                              "a model config's initializer_range far outside the libraries' convention (0.02): "
                              "not trusted as a reference scale", lo=0)
ADAPTER_RATIO = Signature("adapter_ratio", "number", "entry", "median",
                          "median over low-rank adapters of ||B A|| / ||W|| on entry", lo=0)
ADAPTER_N = Signature("adapter_n", "integer", "entry", "lead", "low-rank adapters found", lo=0)
REFERENCE_FIRST = Signature("reference_first", "number", "entry", "median",
                            "the reference loss of the model as training found it")
REFERENCE_TAIL = Signature("reference_tail", "number", "run", "median",
                           "median of the last quarter of the reference losses")
REFERENCE_N = Signature("reference_n", "integer", "run", "min", "reference losses recorded", lo=0)
REFERENCE_NONFINITE = Signature("reference_nonfinite", "integer", "run", "max",
                                "reference losses that were not finite", lo=0)

SIGNATURES = (STEP_RATIO_MEDIAN, STEP_RATIO_MAX, STEP_RATIO_PEAK, STEP_RATIO_STEPS, INIT_SCALE_LOG10, INIT_SCALE_N,
              CONFIG_INIT_RANGE, ADAPTER_RATIO, ADAPTER_N, REFERENCE_FIRST, REFERENCE_TAIL, REFERENCE_N,
              REFERENCE_NONFINITE)


def step_size_state(median_ratio: float | None, max_ratio: float | None = None,
                    peak_ratio: float | None = None) -> str | None:
    """'normal', 'tiny', 'small', 'elevated', 'large' or 'extreme' from the update ratios
    (``None``: not measured).

    "Tiny" reads the largest ratio of *any* layer: vanishing gradients shrink the updates of the
    input-side layers under plain SGD, but the output side still moves; a learning rate that
    is too low holds every layer still. "Large" reads the median over layers, so one layer
    with near-zero weights (a fresh bias, a norm offset) cannot make a whole run look large.
    "Extreme" reads the median layer's largest step over the window (``peak_ratio``): a single
    update that moves the weights by more than their own norm.
    """
    if median_ratio is None:
        return None
    top = median_ratio if max_ratio is None else max(max_ratio, median_ratio)
    if top < STEP_TINY:
        return "tiny"
    if peak_ratio is not None and peak_ratio > STEP_EXTREME:
        return "extreme"
    if median_ratio > STEP_LARGE:
        return "large"
    if median_ratio > STEP_ELEVATED:
        return "elevated"
    return "small" if top < STEP_SMALL else "normal"


def init_scale_state(log10_factor: float | None) -> str | None:
    """'normal', 'small' or 'large' from the median log10 weight-scale factor."""
    if log10_factor is None:
        return None
    if log10_factor < -INIT_LOG10_CUT:
        return "small"
    if log10_factor > INIT_LOG10_CUT:
        return "large"
    return "normal"


def retention_fraction(first: float, tail: float, chance: float | None) -> float | None:
    """Share of the reference's margin given up: ``(tail - first) / (chance - first)``, or
    ``(tail - first) / first`` without a chance level above ``first`` (None when neither
    margin is positive). Negative when the reference improved. Pure."""
    margin = chance - first if chance is not None and chance > first else first
    return (tail - first) / margin if margin > 0 else None


def retention_state(fraction: float | None) -> str | None:
    """'kept', 'partial' or 'lost' from :func:`retention_fraction` (None: not measured)."""
    if fraction is None:
        return None
    if fraction > RETENTION_LOST:
        return "lost"
    return "partial" if fraction > RETENTION_PARTIAL else "kept"


def retention_not_kept(state: object) -> bool:
    """Whether an observed ``retention`` state says the run gave up part of its reference
    (then the reference is a symptom: a hypothesis' sentence, verification's outcome)."""
    return state in ("partial", "lost")


def scale_invariant(optimizer: str | None) -> bool:
    """Whether an optimizer's step is (nearly) independent of the gradient's scale: the adaptive
    ones that divide by a running gradient magnitude (Adam and its variants, Adagrad, RMSprop,
    Adafactor, LAMB) or take its sign (Lion). By class name; ``False`` when unknown."""
    name = (optimizer or "").lower()
    return any(k in name for k in ADAPTIVE_NAMES)


def step_size(view: TraceView) -> Reading | None:
    """The step size the optimizer took, from the update/weight ratios of the first steps.

    Large steps under an optimizer whose step follows the gradient's scale (SGD) are no reading
    of the learning rate when the input is off-scale (``input_scale``): its gradients are
    inflated by the input, at any rate."""
    sigs = view.signatures
    med, top, peak = sigs.number(STEP_RATIO_MEDIAN), sigs.number(STEP_RATIO_MAX), sigs.number(STEP_RATIO_PEAK)
    state = step_size_state(med, top, peak)
    if state is None:
        return view.unmeasured(STEP_RATIO_MEDIAN, "no optimizer step was measured")
    note = (f"update/weight ratio {med:.3g} per step (median layer"
            + (f", {top:.3g} in the fastest layer" if top is not None else "")
            + (f", {peak:.3g} at its largest" if peak is not None else "") + f"; {state})")
    from neuraldbg.causal.nodes.schedule import COLLAPSE_TWO_REGIMES, collapse_step_of

    measured_by, collapse = sigs.step(STEP_RATIO_MEDIAN), collapse_step_of(view)
    if state not in ("large", "elevated", "extreme") and collapse is not None and \
            (measured_by is None or measured_by < collapse):
        # steps measured at the rate before its collapse say nothing of the rate after it
        return Reading(None, (), note, reason=COLLAPSE_TWO_REGIMES.format(collapse) + "; the step size was "
                                                                                      "measured before it")
    if state in ("large", "elevated", "extreme") and input_scale_state(sigs.number(INPUT_RMS_MAX)) == "large" \
            and not scale_invariant(sigs.value(OPTIMIZER)):
        return Reading(None, (), note, reason=(f"the input is off-scale (feature RMS {sigs.number(INPUT_RMS_MAX):.3g}):"
                                               " its gradients, and so these steps, are inflated at any learning "
                                               "rate"))
    return Reading(state, (), note)


def init_scale(view: TraceView) -> Reading | None:
    """The weights' scale on entry against their reference scales (or adapters' start);
    unobserved on a run entered on trained weights (``started_trained``)."""
    sigs = view.signatures
    trained = started_trained(sigs)
    if trained:
        # the monitor's own reason when it did not measure them (it says the same), else this one
        return Reading(None, reason=view.gap(INIT_SCALE_LOG10) or not_at_init(
            trained, "the scale of trained weights says nothing of their initialization"), gap=True)
    a = sigs.number(ADAPTER_RATIO)
    if a is not None and a > ADAPTER_LARGE:  # adapters' reference is zero: B = 0 at the start
        return Reading("large", (), (f"low-rank adapters start at {a:.3g}x the norm of the frozen layers they "
                                     "adapt (LoRA starts at 0: B = 0)"))
    f = sigs.number(INIT_SCALE_LOG10)
    state = init_scale_state(f)
    if state is None:
        return view.unmeasured(INIT_SCALE_LOG10, "no weight matrix was measured on entry")
    note = f"weights {10 ** f:.3g}x their reference scale at the first step ({state})"
    cfg = sigs.number(CONFIG_INIT_RANGE)
    if cfg is not None:  # the config made them: it is named, not trusted as a reference
        note += (f"; the config's initializer_range {cfg:.3g} is {cfg / CONFIG_RANGE_CONVENTION:.3g}x the "
                 f"libraries' convention {CONFIG_RANGE_CONVENTION:g}")
    first, chance = _first_loss(view), chance_loss(sigs)
    if state != "normal" and first is not None and chance is not None and first < TRAINED_START * chance:
        # weights off every reference while the model already does far better than chance: they
        # were trained (a pre-trained or resumed model), not initialized
        return Reading(None, (), note, reason=f"not at initialization: the first loss {first:.3g} is far below "
                                              f"chance ({chance:.3g}), so the weights were trained, not initialized")
    return Reading(state, (), note)


def _first_loss(view: TraceView) -> float | None:
    """The loss of the trace's first step, when recorded and finite."""
    hist = view.trace.loss.history
    if not hist or hist[0][0] != view.trace.first_step or not math.isfinite(hist[0][1]):
        return None
    return hist[0][1]


def retention(view: TraceView) -> Reading | None:
    """How much of the reference task's margin to chance the run gave up."""
    sigs = view.signatures
    first, tail = sigs.number(REFERENCE_FIRST), sigs.number(REFERENCE_TAIL)
    n = sigs.number(REFERENCE_N) or 0
    if first is None or tail is None or n < MIN_REFERENCE_POINTS:
        return Reading(None, reason="no reference loss was given (NeuralDbg(reference=fn))" if first is None
                       else "too few finite reference losses")
    chance = chance_loss(sigs)
    frac = retention_fraction(first, tail, chance)
    state = retention_state(frac)
    if state is None:
        return Reading(None, reason="the reference loss has no margin to lose")
    to = f"chance ({chance:.3g})" if chance is not None and chance > first else "its own start"
    return Reading(state, (), (f"the reference loss went from {first:.3g} to {tail:.3g}: {frac:.0%} of its margin "
                               f"to {to} given up ({state})"))


NODES = (
    Table(
        "step_size", ("normal", "tiny", "large", "elevated", "small", "extreme"),
        parents=("initialization", "learning_rate", "numerics"),
        rows=(
            ({"numerics": "updates_lost"}, (0.08, 0.55, 0.01, 0.01, 0.34, 0.01)),
            ({"learning_rate": "too_high"}, (0.075, 0.01, 0.35, 0.16, 0.005, 0.40)),
            ({"learning_rate": "too_low"}, (0.08, 0.60, 0.01, 0.01, 0.295, 0.005)),
            ({"initialization": "too_small"}, (0.35, 0.05, 0.25, 0.19, 0.01, 0.15)),
            ({"initialization": "too_large"}, (0.40, 0.40, 0.045, 0.05, 0.10, 0.005)),
            ({}, (0.80, 0.015, 0.013, 0.12, 0.05, 0.002)),
        ),
        why="The update-to-weight ratio ||w_after - w_before|| / ||w_before|| per layer at its "
            "peak over the run (median over layers): the step size the optimizer actually took. "
            "A healthy run takes 0.005..0.1 per step; 'extreme' is a first update at the peak "
            "rate larger than the weights themselves. Its only parents are the learning "
            "rate and the weight scale it is relative to: an adaptive optimizer takes steps of "
            "about lr whatever the weights, so tiny weights read as large steps and huge "
            "weights as tiny ones; the initialization signature tells those apart. Updates that "
            "round away in half-precision weights read as tiny or small steps whatever the rate "
            "(the numerics parent): the step taken is not the step the rate asked for.",
        extract=step_size,
    ),
    Table(
        "init_scale", ("normal", "small", "large"), parents=("initialization",),
        rows=(
            ({"initialization": "too_small"}, (0.08, 0.90, 0.02)),
            ({"initialization": "too_large"}, (0.08, 0.02, 0.90)),
            ({}, (0.99, 0.005, 0.005)),
        ),
        why="The weights' RMS at the first checked step against the nearest reference scale of "
            "their type and fan-in (PyTorch's default kaiming-uniform, Xavier, Kaiming, the std "
            "0.02 of transformer libraries), as the median over weight matrices: a direct "
            "signature of the initialization, whatever normalization or Adam later hide. Weights "
            "that are exactly zero by design (a LoRA B, a zero-init projection) are left out.",
        extract=init_scale,
    ),
    Table(
        "retention", ("kept", "partial", "lost"), parents=("data", "learning_rate"),
        rows=(
            ({"learning_rate": "too_high"}, (0.15, 0.25, 0.60)),
            ({"data": "shifted"}, (0.40, 0.25, 0.35)),
            ({"data": "corrupted"}, (0.60, 0.20, 0.20)),
            ({"learning_rate": "too_low"}, (0.97, 0.02, 0.01)),
            ({}, (0.85, 0.12, 0.03)),
        ),
        why="How much of a reference task the run gave up (observed only when the user gives "
            "NeuralDbg a reference loss: a fine-tune's pre-training task on a held-out batch): "
            "the share of its margin to chance lost by the end of the run. A fine-tune at a "
            "step size that rewrites the pre-trained weights forgets it while learning the new "
            "task as well as a healthy one; training on shifted data overwrites it too. A "
            "healthy fine-tune gives some of it up, a too-low learning rate none.",
        extract=retention,
    ),
)


def lacks_initialization(view: TraceView) -> str | None:
    """Why the run has no initialization to be at fault (it was entered on trained weights:
    ``started_trained``), or ``None`` when it started at one or the monitor cannot tell."""
    trained = started_trained(view.signatures)
    return None if trained is None else not_at_init(trained, "nothing it shows comes from an initialization")


PRECONDITIONS = tuple(
    Precondition(
        "initialization", state, "a run that starts at initialization", lacks_initialization,
        why="A faulty initialization shows in the first steps, before training has moved the weights (their "
            "scale on entry, a first loss far above chance, layers saturated or exploding from step 0). A run "
            "entered on trained weights (a resume, a loaded state_dict, a pre-trained model) has no such steps: "
            "what its first monitored step shows was made by the updates before the monitor, so its "
            "initialization is no cause of anything it shows.",
    )
    for state in ROOTS["initialization"][1:]
)
