"""Symptoms in the loss: its pattern over the run, its start, and what came first.

``loss_pattern`` is one variable so a spike, a divergence and a NaN loss are one observation;
its states are ordered by precedence and the worst pattern seen is the one observed. Families
whose objective is a game (the ``non_monotone`` trait: GAN, RL) read only blow-ups beyond
``GAME_BAND``; their progress is no evidence.

Cut points (reasoning in ``docs/causal_model.md``):

* ``MIN_LOSS_POINTS`` -- fewer recorded losses than this: slow vs decreasing is unknowable.
* ``FLAT_REL``/``SLOW_REL`` -- relative improvement of the loss (median of the first vs the last
  ``LOSS_EDGE`` fraction of the history) under which the curve is "flat" or "slow".
* ``START_CHANCE_FACTOR`` -- ``loss_start`` is "high" when the first loss is above this many times
  ``ln K`` (an untrained classifier starts near ``ln K`` however fast it then learns); without a
  known ``K``, ``START_FACTOR``/``MIN_START_POINTS``: more than ``START_FACTOR`` times the median
  of the second half of the run (at least ``MIN_START_POINTS`` finite losses). Healthy curves
  drop 3-50x over a short run; a forward pass blown up by the weights starts orders of magnitude
  above where it settles.
* ``GAME_BAND`` -- GAN and RL losses swing with the game; a loss this many times its start (the
  median of the first ``LOSS_HEAD`` of the run) is a blow-up.
* ``STALLED`` -- ``progress`` is "stalled" when the median of the last ``PROGRESS_TAIL`` of the
  run is at or above this share of its reference: chance level ``ln K`` when ``K`` is known
  (however the run started), else the median of its own first ``LOSS_HEAD`` -- unobserved then
  for a run that did not start at initialization (it has little left to gain). Within
  10 % of chance a run has not learned, whatever else it shows; healthy runs of both suites end
  at 0.002..0.74 of their reference (a fine-tune of GPT-2 the highest).
* ``NEAR_CHANCE`` -- against chance level, a loss that ends within 10 % of ``ln K`` is near
  chance, whether it got there flat or by a slow drift (then ``loss_pattern`` reads "slow"). A
  wider band (20 %: a loss drifting down to 0.87 ``ln K`` has not learned either) reads healthy
  runs as stalled: a healthy MLP after its first 21 steps sits at 0.83 ``ln K`` on its way
  down, and the ecosystem's ``lora_bert``, whose recipe barely leaves chance in its 120 steps,
  ends at 0.81-0.86 on 3 of seeds 0-8. Telling a drift from a run on its way down needs the
  curve's pace, not a level: see ``DRIFT_BAND``.
* ``DRIFT_BAND``/``PACE_RUNS`` -- between ``DRIFT_BAND`` and ``NEAR_CHANCE`` of chance level a
  loss is stalled when it has stopped moving: at the pace of the last half of the run
  (:func:`pace_runs`) it would need more than ``PACE_RUNS`` further runs of the same length to
  reach half of chance level. A run on its way down covers that in a fraction of a run (the
  healthy MLP after 21 steps); slow healthy learners of both suites (a LoRA fine-tune that barely
  leaves chance, a GPT-2 adapter at 0.74) need 1.3-1.8 runs; a schedule that collapsed to a
  thousandth of its peak leaves the loss at 0.80-0.87 of chance needing ten runs or never.
"""
from __future__ import annotations

import math
from typing import Sequence

from neuraldbg.causal.nodes.floor import (LOSS_HEAD, head_level, median, spikes_were_mistakes,
                                          starts_at_floor)
from neuraldbg.causal.nodes.output import output_collapse
from neuraldbg.causal.nodes.run import chance_loss, not_at_init, started_trained
from neuraldbg.causal.structure import NoisyMax, Reading
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import OPTIMIZER, Event
from neuraldbg.trace import Trace
from neuraldbg.vocab import has_trait

#: where these nodes stand among the others (neuraldbg/causal/nodes/__init__.py)
ORDER = 30

MIN_LOSS_POINTS = 20
LOSS_EDGE = 0.1
FLAT_REL = 0.02
SLOW_REL = 0.10
START_FACTOR = 100.0
MIN_START_POINTS = 10
START_CHANCE_FACTOR = 4.0
GAME_BAND = 50.0
MIN_RISE_POINTS = 10
STALLED = 0.9
NEAR_CHANCE = 0.9
DRIFT_BAND = 0.8
PACE_RUNS = 5.0
PROGRESS_TAIL = 0.2

#: loss-pattern states that say "no instability" (a partial observation when progress is unknowable)
CALM_LOSS = ("decreasing", "slow", "flat")


def relative_improvement(values: list[float]) -> float:
    """(median of the first ``LOSS_EDGE`` of the values - median of the last) / |first median|."""
    n = len(values)
    k = max(1, int(round(n * LOSS_EDGE)))
    head = sorted(values[:k])[k // 2]
    tail = sorted(values[-k:])[k // 2]
    if head == 0:
        return 0.0
    return (head - tail) / abs(head)


def loss_rise(trace: Trace) -> float | None:
    """Largest finite ``|loss|`` over the median ``|loss|`` of the first ``LOSS_HEAD`` of the run
    (None with fewer than ``MIN_RISE_POINTS`` finite losses or a zero start)."""
    vals = [abs(v) for _, v in trace.loss.history if v == v and abs(v) != float("inf")]
    if len(vals) < MIN_RISE_POINTS:
        return None
    head = sorted(vals[:max(1, int(len(vals) * LOSS_HEAD))])
    ref = head[len(head) // 2]
    return max(vals) / ref if ref > 0 else None


def loss_pattern(view: TraceView) -> Reading | None:
    """The loss pattern (a state, a set of states, or unobserved when no loss was recorded)."""
    trace, loss = view.trace, view.trace.loss
    opt = [e for e in view.events if e.type == OPTIMIZER]
    nonfinite = [e for e in opt if e.kind == "divergence" and e.measured.get("nonfinite", 0.0) > 0]
    if loss.n_nonfinite > 0 or nonfinite:
        step = loss.first_nonfinite_step if loss.first_nonfinite_step is not None else nonfinite[0].step
        return Reading("nonfinite", tuple(nonfinite), f"non-finite loss from step {step}")
    div = [e for e in opt if e.kind == "divergence"]
    spikes = [e for e in opt if e.kind == "spike"]
    if has_trait(trace.family, "non_monotone"):
        return _game_pattern(trace, div, spikes)
    if div:
        return Reading("divergence", tuple(div), f"loss diverges from step {div[0].step}")
    if spikes and not spikes_were_mistakes(view):
        return Reading("spike", tuple(spikes), f"loss spike at step {spikes[0].step}")
    r = _calm_pattern(loss, opt)
    if not spikes or r.state is None:
        return r
    # the spikes were a confident model's mistakes on single batches: the curve is read without
    # them, and the note says why they were not read as instability
    peaks = ", ".join(f"step {e.step} ({e.measured['loss']:.3g})" for e in spikes[:3])
    what = "loss spikes" if len(spikes) > 1 else "a loss spike"
    return Reading(r.state, r.support, f"{r.note}; {what} at {peaks} stayed below chance level and the loss was "
                                       "back at its level on the next batches: confident mistakes, not instability")


def _calm_pattern(loss, opt: list[Event]) -> Reading:
    """The pattern of a loss without divergence or spikes: flat (a plateau event), slow or
    decreasing, or unknown progress with too few losses."""
    if loss.n == 0 and not opt:
        return Reading(None, reason="no loss was recorded")
    plateau = [e for e in opt if e.kind == "plateau"]
    if plateau:
        return Reading("flat", tuple(plateau), f"loss plateau from step {plateau[0].step}")
    vals = [v for _, v in loss.history if v == v and abs(v) != float("inf")]
    if loss.n < MIN_LOSS_POINTS or len(vals) < MIN_LOSS_POINTS // 2:
        return Reading(CALM_LOSS, (), f"only {loss.n} losses recorded: progress unknown")
    imp = relative_improvement(vals)
    if imp < FLAT_REL:
        return Reading("flat", (), f"loss improved {imp:.1%} over the run")
    if imp < SLOW_REL:
        return Reading("slow", (), f"loss improved only {imp:.1%} over the run")
    return Reading("decreasing", (), f"loss improved {imp:.1%} over the run")


def loss_pattern_of(view: TraceView) -> Reading:
    """:func:`loss_pattern` of ``view``, read once per view (other extractors consult it)."""
    return view.memo("loss_pattern", loss_pattern)


#: the patterns a return to chance level draws (a jump back up, then a plateau at chance)
RETURN_PATTERNS = ("slow", "flat", "spike", "divergence")


def _returned_to_chance(view: TraceView) -> bool:
    """Whether ``target_fault`` reads a return to chance level (read once per view)."""
    from neuraldbg.causal.nodes.data import target_fault_of  # data.py builds on this module
    r = target_fault_of(view)
    return r is not None and r.state == "back_to_chance"


def loss_pattern_reading(view: TraceView) -> Reading | None:
    """The ``loss_pattern`` evidence: :func:`loss_pattern`, except after a return to chance level.

    A loss that learned and then went back to chance (``target_fault``) draws a jump and a
    plateau; read again here as "spike" or "flat" it would count the same curve twice, as two
    independent witnesses. The pattern is then the partial observation "one of the shapes a
    return draws" (:data:`RETURN_PATTERNS`), which excludes a steadily falling loss and a
    non-finite one and leaves the return itself to ``target_fault``. A curve that started above
    the level it went back to (a language model's first loss above ``ln K``) reads "decreasing"
    from end to end although it went back; that reading is the same curve too, so the pattern
    is then unobserved. Likewise, without a chance level, a "decreasing" loss whose model output
    collapsed (``output_collapse``) only learned a constant: the pattern is then "no
    instability", undecided between its calm shapes. So is a flat or slow curve of a run entered
    on trained weights at its floor (:func:`starts_at_floor`): a fine-tune with little left to
    gain, whatever its rate. A "decreasing" loss that started near chance and still ends near
    it (:func:`near_chance_drift`) reads "slow"."""
    from neuraldbg.causal.nodes.schedule import two_regimes  # builds on this module

    r = loss_pattern_of(view)
    if r is not None and r.state in CALM_LOSS and (two := two_regimes(view)) is not None:
        # a calm curve of a run whose rate collapsed mixes the rate's two regimes (a fall while
        # it lasted, a stand after); the stand is lr_schedule's reading, an instability is still read
        return two
    if r is not None and r.state == "decreasing" and chance_loss(view.signatures) is None and _collapsed(view):
        # as for progress: without a chance level, a fall whose output collapsed is a constant
        # being learned; what remains observed is that the loss did not blow up
        return Reading(CALM_LOSS, r.support, f"{r.note} (the model's output collapsed to a constant: the fall is "
                                             "that constant being learned)")
    if r is None:
        return r
    if not _returned_to_chance(view):
        return _near_chance(view, _at_floor(view, r))
    if r.state == "decreasing":
        return Reading(None, reason="the loss started above the level it went back to: its fall from start to "
                                    "end is the return target_fault reads")
    if r.state not in RETURN_PATTERNS:
        return r
    return Reading(RETURN_PATTERNS, r.support, f"{r.note} (the return to chance level target_fault reads)")


def _at_floor(view: TraceView, r: Reading) -> Reading:
    """``r``, or "no instability" (:data:`CALM_LOSS`) when it reads a flat or slow curve of a run
    entered on trained weights at its floor (:func:`starts_at_floor`): a model that already sits
    at its floor has little left to gain, so its flat curve is no stall and no sign of a rate too
    low -- a fine-tune at a small, sound rate draws it -- while a spike or a blow-up still is."""
    if r.state not in ("flat", "slow") or not started_trained(view.signatures):
        return r
    chance = chance_loss(view.signatures)
    vals = [v for _, v in view.trace.loss.history if math.isfinite(v)]
    if not starts_at_floor(vals, chance):
        return r
    where = "" if chance is None else f" (far below chance level {chance:.3g})"
    return Reading(CALM_LOSS, r.support, f"{r.note}; the run was entered on trained weights at its floor{where}: "
                                         "little left to gain, so a flat curve is no stall")


def near_chance_drift(values: Sequence[float], chance: float | None) -> float | None:
    """Where a loss that started near chance level ends against it, when it ends near it too:
    ``tail / chance`` (as :func:`progress_ratio` reads the tail) when the median of its first
    ``LOSS_HEAD`` is at most ``chance / NEAR_CHANCE`` (not a blown-up start) and the tail at least
    ``NEAR_CHANCE`` x chance; else ``None`` (also without a chance level or under
    ``MIN_LOSS_POINTS`` values). Pure."""
    got = progress_ratio(values, chance)
    if chance is None or got is None:
        return None
    head = head_level(values)
    return got[0] if head <= chance / NEAR_CHANCE and got[0] >= NEAR_CHANCE else None


def _near_chance(view: TraceView, r: Reading) -> Reading:
    """``r``, or "slow" when it reads a "decreasing" loss that drifted from near chance level to
    near it (:func:`near_chance_drift`): a fall of a tenth or more from chance that still ends
    within ``NEAR_CHANCE`` of it is no healthy pace of learning -- a flat loss there reads
    "flat", and a slow drift is read as what it is, slow."""
    if r.state != "decreasing":
        return r
    vals = [v for _, v in view.trace.loss.history if math.isfinite(v)]
    ratio = near_chance_drift(vals, chance_loss(view.signatures))
    if ratio is None:
        return r
    return Reading("slow", r.support, f"{r.note}, but it ends at {ratio:.2f}x chance level: a slow drift near chance")


def _game_pattern(trace: Trace, div: list[Event], spikes: list[Event]) -> Reading:
    """The loss pattern of a two-player game or an RL objective: spikes and swings are the
    game, not instability; only a loss that leaves ``GAME_BAND`` times its starting level is
    a blow-up (the discriminator or the critic running away)."""
    rise = loss_rise(trace)
    if rise is None:
        if trace.loss.n == 0 and not (div or spikes):
            return Reading(None, reason="no loss was recorded")
        return Reading(CALM_LOSS, (), "no loss instability (progress is not evidence for this family)")
    if rise >= GAME_BAND:
        return Reading("divergence", tuple(div), f"loss left the game's band: {rise:.3g}x its starting level")
    return Reading(CALM_LOSS, (), (f"loss stays within {rise:.3g}x its starting level (swings are the game "
                                   "here, progress is not evidence)"))


def loss_start(view: TraceView) -> Reading | None:
    """'normal' or 'high' from the first recorded loss against chance level ``ln K`` when the
    output size tells ``K``, else against the second half of the run. Unobserved on a run
    entered on trained weights (``started_trained``): its first loss is no initialization's."""
    trace = view.trace
    hist = trace.loss.history
    trained = started_trained(view.signatures)
    if trained:
        # the first loss of trained weights (a resume, a loaded model) says nothing of how the
        # weights were initialized: after many updates a high start is the run's own doing
        return Reading(None, reason=not_at_init(trained, "its first loss is not that of an initialization"))
    if not hist or hist[0][0] != trace.first_step:
        return Reading(None, reason="the first step's loss was not recorded")
    chance = chance_loss(view.signatures)
    if chance is not None and math.isfinite(hist[0][1]):
        ratio = hist[0][1] / chance
        state = "high" if ratio > START_CHANCE_FACTOR else "normal"
        return Reading(state, (), f"first loss {hist[0][1]:.3g} is {ratio:.3g}x chance level ln K = {chance:.3g}")
    vals = [v for _, v in hist if v == v and abs(v) != float("inf")]
    if len(vals) < MIN_START_POINTS or not (hist[0][1] == hist[0][1] and abs(hist[0][1]) != float("inf")):
        return Reading(None, reason=f"fewer than {MIN_START_POINTS} finite losses and no chance level")
    tail = sorted(vals[len(vals) // 2:])
    ref = tail[len(tail) // 2]
    head = hist[0][1]
    if ref <= 0 or head <= 0:  # the ratio is meaningless for objectives that cross zero
        return Reading(None, reason="the loss crosses zero: a ratio to its start means nothing")
    ratio = head / ref
    state = "high" if ratio > START_FACTOR else "normal"
    return Reading(state, (), f"first loss {head:.3g} is {ratio:.3g}x the later median {ref:.3g}")


def progress_ratio(values: Sequence[float], chance: float | None) -> tuple[float, float, str] | None:
    """``(tail / reference, reference, what the reference is)`` of a loss curve (finite values):
    the reference is chance level when known, else the curve's own start; ``None`` when it
    cannot be read (too short, a reference that is not positive). Pure."""
    n = len(values)
    if n < MIN_LOSS_POINTS:
        return None
    tail = median(values[n - max(3, int(n * PROGRESS_TAIL)):])
    if chance is not None:
        # against chance whatever the start: a run that started trained and still sits far
        # below chance has learned, one that ends near chance has not, however it began
        ref, what = chance, "chance level"
    else:
        ref, what = head_level(values), "its start"
    return (tail / ref, ref, what) if ref > 0 else None


def progress_state(ratio: float, against_chance: bool, pace: float | None = None) -> str:
    """'stalled' or 'learning' from :func:`progress_ratio`'s ratio: stalled at or above
    ``NEAR_CHANCE`` of chance level (``against_chance``), or ``STALLED`` of the run's own start;
    between ``DRIFT_BAND`` and ``NEAR_CHANCE`` of chance, stalled when ``pace`` (:func:`pace_runs`)
    exceeds ``PACE_RUNS``. Pure."""
    if not against_chance:
        return "stalled" if ratio >= STALLED else "learning"
    if ratio >= NEAR_CHANCE:
        return "stalled"
    return "stalled" if ratio >= DRIFT_BAND and pace is not None and pace > PACE_RUNS else "learning"


def pace_runs(values: Sequence[float], target: float) -> float | None:
    """How many more runs of this length the loss would need to reach ``target`` at the pace of
    the last half of the run: the fall per step between the medians of the first and the last
    eighth (at least 3 values) of that half, against the distance from the tail (as
    :func:`progress_ratio` reads it) to ``target``; ``math.inf`` when it did not fall, 0 when it
    is already there, ``None`` under ``MIN_LOSS_POINTS`` values. Pure."""
    n = len(values)
    if n < MIN_LOSS_POINTS:
        return None
    w, half = max(3, n // 8), n // 2
    start, end = median(values[half:half + w]), median(values[n - w:])
    tail = median(values[n - max(3, int(n * PROGRESS_TAIL)):])
    if tail <= target:
        return 0.0
    fall = (start - end) / max(1, (n - w) - half)
    return (tail - target) / fall / n if fall > 0 else math.inf


def progress(view: TraceView) -> Reading | None:
    """Whether the run learns: its loss against chance level, or against its own start."""
    trace = view.trace
    if has_trait(trace.family, "non_monotone"):
        return Reading(None, reason=f"a {trace.family} loss is a game: how far it fell says nothing of learning")
    from neuraldbg.causal.nodes.schedule import two_regimes  # builds on this module

    if (two := two_regimes(view)) is not None:
        return two
    vals = [v for _, v in trace.loss.history if math.isfinite(v)]
    chance = chance_loss(view.signatures)
    trained = started_trained(view.signatures)
    if chance is None and trained:
        # a resumed or pre-trained run has little left to gain: a flat loss is no stall
        return Reading(None, reason=f"no chance level to read the loss against, and the run did not start at "
                                    f"initialization ({trained})")
    if chance is None and _collapsed(view):
        # against its own start a fall is learning only if what was learned depends on the input:
        # an output that collapsed learned a constant (a regression's target mean), and that is
        # output_collapse's reading, not progress
        return Reading(None, reason="no chance level, and the model's output collapsed to a constant: the loss's "
                                    "fall from its start is that constant being learned")
    got = progress_ratio(vals, chance)
    if got is None:
        return Reading(None, reason=f"fewer than {MIN_LOSS_POINTS} finite losses, or no positive reference")
    ratio, ref, what = got
    pace = pace_runs(vals, 0.5 * chance) if chance is not None and DRIFT_BAND <= ratio < NEAR_CHANCE else None
    state = progress_state(ratio, chance is not None, pace)
    if state == "stalled" and _returned_to_chance(view):
        # the run learned, then its loss went back to chance: the stall is that return, which
        # target_fault reads; as "not learning" it would be counted twice (and blamed on causes
        # that never let a run learn: a learning rate too low, a decayed signal)
        return Reading(None, reason=(f"the loss learned, then went back to chance ({ratio:.2f}x {what}): "
                                     "the stall is that return, read by target_fault"))
    if pace is not None and state == "stalled":
        at = "it has stopped falling" if math.isinf(pace) else \
            f"at its pace over the last half it would need {pace:.0f} more runs of this length to reach half of it"
        return Reading(state, (), f"the loss ends at {ratio:.2f}x {what} ({ref:.3g}) after {trace.loss.n} steps, "
                                  f"and {at}")
    return Reading(state, (), f"the loss ends at {ratio:.2f}x {what} ({ref:.3g}) after {trace.loss.n} steps")


def _collapsed(view: TraceView) -> bool:
    return output_collapse(view).state == "present"


NODES = (
    NoisyMax(
        "loss_pattern", ("decreasing", "slow", "flat", "spike", "divergence", "nonfinite"),
        leak={"slow": 0.12, "flat": 0.04, "spike": 0.04, "divergence": 0.01, "nonfinite": 0.003},
        effects={
            "learning_rate=too_low": {"slow": 0.40, "flat": 0.45},
            "signal_decay=depth": {"flat": 0.55, "slow": 0.20},
            "signal_decay=uniform": {"flat": 0.65, "slow": 0.15},
            "instability=training": {"nonfinite": 0.35, "divergence": 0.30, "spike": 0.20, "flat": 0.10},
            "instability=init": {"nonfinite": 0.15, "divergence": 0.05, "spike": 0.10,
                                 "flat": 0.10, "slow": 0.10},
            "corruption=values": {"nonfinite": 0.80, "spike": 0.08, "divergence": 0.05},
            "corruption=targets": {"flat": 0.35, "spike": 0.15, "slow": 0.15},
            "data=shifted": {"spike": 0.40},
            "unexplained=not_learning": {"flat": 0.5, "slow": 0.3},
            "numerics=overflow": {"nonfinite": 0.80, "divergence": 0.05},
            "numerics=updates_lost": {"flat": 0.45, "slow": 0.40},
        },
        why="The loss curve, as one variable so spike/divergence/NaN loss are one observation. "
            "States are ordered by precedence: the worst pattern seen is the one observed.",
        extract=loss_pattern_reading,
    ),
    NoisyMax(
        "loss_start", ("normal", "high"),
        leak={"high": 0.04},
        effects={
            "instability=init": {"high": 0.60},
            "data=shifted": {"high": 0.10},
        },
        why="The first loss, before any update, far above the level the run later settles "
            "at: the forward pass is blown up by the weights (or inputs) themselves.",
        extract=loss_start,
    ),
    NoisyMax(
        "progress", ("learning", "stalled"),
        leak={"stalled": 0.01},
        effects={
            "unexplained=not_learning": {"stalled": 0.97},
            "learning_rate=too_low": {"stalled": 0.85},
            "signal_decay=depth": {"stalled": 0.7},
            "signal_decay=uniform": {"stalled": 0.8},
            "instability=training": {"stalled": 0.4},
            "instability=init": {"stalled": 0.5},
            "training_loop=stale_gradients": {"stalled": 0.4},
            "training_loop=params_not_in_optimizer": {"stalled": 0.5},
            "training_loop=graph_detached": {"stalled": 0.5},
            "training_loop=loss_on_probabilities": {"stalled": 0.5},
            "corruption=targets": {"stalled": 0.6},
            "data=shifted": {"stalled": 0.2},
            "numerics=updates_lost": {"stalled": 0.85},
            "numerics=overflow": {"stalled": 0.3},
        },
        why="Whether the run learns at all: its loss at the end within 10 % of chance level, flat or drifting "
            "there slowly, or within 20 % of it and no longer falling at a pace that would take it anywhere "
            "(or within 10 % of its own start). A healthy run learns, so the leak is small; a run "
            "that does not learn while no modeled cause explains it is the 'unexplained' leak root's "
            "(not_learning).",
        extract=progress,
    ),
)


def never_healthy(view: TraceView) -> str | None:
    """Why the run cannot be healthy, or None: a classifier whose loss stays near chance level
    (``progress`` reads "stalled" against ``ln K``) did not learn, whatever else it shows, so
    ``P(healthy)`` is 0 and the stall goes to the causes that can make it (``unexplained``
    among them). Without a chance level a stall is read against the run's own start, which a
    healthy run can stay near, so it rules nothing out."""
    if chance_loss(view.signatures) is None:
        return None
    r = view.memo("progress", progress)
    if r is None or r.state != "stalled":
        return None
    return f"a run whose loss stays near chance level is never healthy ({r.note})"
