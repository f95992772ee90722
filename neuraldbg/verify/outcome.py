"""Did the symptom vanish under the intervention? The replayed window against the original one.

The replay draws the same batches as the original run (``replay(model, optimizer, step)`` is
the user's step function, and the RNG state is restored with the snapshot), so the two loss
curves are paired step by step and their difference is the intervention's effect, not batch
noise. Each step's relative improvement is ``d = (orig - replay) / max(|orig|, |replay|)``,
in ``[-1, 1]`` whatever the loss' scale or sign, with the non-finite cases at the ends: ``+1``
when only the original is NaN/Inf, ``-1`` when only the replay is, ``0`` when both are.
The *improvement* is the mean of ``d`` over the late part of the window: from the onset on and
over its second half, where the effect of the changed updates has built up.

Not every symptom shows in the loss: attention rows stuck one-hot by oversized query/key
weights train at a healthy loss for many steps. So the hypothesis' own events count too. Its
*symptoms* are the events behind it (``Hypothesis.evidence``) that the original run raised
inside the window early enough to be confirmed before it ends (:func:`symptoms_in`); the
replay's fresh monitor saw the same steps the same way only when the window starts at the
run's first step (before that, its detectors lack the history the original's had), so events
are compared only then. The symptom *vanished* when the improvement exceeds
:data:`VANISHED_IMPROVEMENT`, or when none of the symptoms' kinds recurs in the replay (at any
layer) while its loss is no worse than that threshold and not non-finite more often than the
original's; else it *persisted*. (A replay that silences the events of a GAN by barely
training it, its loss twice the original's, has not shown the fix.)

A fine-tune that forgets its pre-trained task learns the new one like a healthy run: its
symptom is the *reference* loss (``NeuralDbg(..., reference=fn)``), which the replay's monitor
records at the same steps as the original's. When the run gave up part of the reference
(the ``retention`` signature is not ``kept``), the symptom also vanished when the reference
improves over the window's late records (:func:`reference_gain`) by more than the threshold
plus :data:`REFERENCE_TRADE` times what the training loss lost, without a new non-finite
loss. Any lower learning rate forgets more slowly because it learns more slowly: on a task
that overwrites the reference, a healthy rate divided by ten keeps the reference better by
at most about what it costs the task (0.1-1.35x, measured). A step size beyond what the task needs
is cut at little cost: the reference gains 3.4-8.2x what the task loses, or the task gains
too.

What these outcomes say about each root cause is not decided here: the likelihoods
``P(vanished | intervention, true cause)`` are fitted from benchmark runs
(:mod:`neuraldbg.verify.likelihoods`), which are refused when they were fitted under another
:data:`RULE`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: Mean relative improvement of the late window from which the symptom counts as vanished:
#: a twentieth of the loss (or a NaN curve turned finite on a twentieth of the late steps).
#: Set once, before any benchmark run was scored; what an outcome is worth per cause and
#: family is the fitted likelihoods' business.
VANISHED_IMPROVEMENT = 0.05
#: How many times the training loss' relative loss the reference must gain to count as kept:
#: between the plain speed/retention trade of a rate /10 (0.1-1.35x: a PEFT GPT-2 and an MLP
#: fine-tuned on tasks that overwrite their reference) and a rate beyond what the task needs
#: (3.4-8.2x: the zoo's LoRA at 50x its rate). docs/verification.md has the figures.
REFERENCE_TRADE = 2.0
OUTCOMES = ("persisted", "vanished")
#: The rule outcomes are decided by; a likelihood file records the rule it was fitted under.
RULE = ("loss improvement, or the symptom events gone (loss no worse) in a replay from the first step, "
        "or the reference loss improved by more than twice the training loss' loss where retention was not kept")

Symptom = tuple[str, str]  # (event type, kind)


@dataclass(frozen=True)
class Comparison:
    """The paired comparison of one window."""

    outcome: str               # "vanished" or "persisted"
    improvement: float         # mean relative improvement over the late steps
    late_steps: int            # paired steps it averages
    nonfinite_before: int      # non-finite losses of the original in the window
    nonfinite_after: int       # ... and of the replay
    symptoms: int = 0          # the hypothesis' events the paired window shows (symptoms_in)
    symptoms_after: int = 0    # replay events of those kinds
    reference_gain: float | None = None  # the reference's late improvement (retention lost only)


def relative_gain(orig: float, new: float) -> float:
    """``(orig - new) / max(|orig|, |new|)``; +1/-1/0 for the non-finite cases (module docstring)."""
    fo, fn = math.isfinite(orig), math.isfinite(new)
    if not fo and not fn:
        return 0.0
    if not fo:
        return 1.0
    if not fn:
        return -1.0
    den = max(abs(orig), abs(new))
    return 0.0 if den == 0 else (orig - new) / den


def late_steps(start: int, end: int, onset: int | None) -> range:
    """The steps the improvement averages: from ``max(onset, middle of the window)`` to ``end``."""
    mid = start + (end - start) // 2
    first = max(mid, onset if onset is not None else start)
    return range(min(first, end - 1), end)


def symptoms_in(events: Iterable[Any], start: int, end: int, latency: int) -> list[Symptom]:
    """``(type, kind)`` of the ``events`` that began in ``[start, end - latency)``: the ones a
    monitor replaying ``[start, end)`` would have confirmed (``latency``: steps a regime must
    hold before it is reported)."""
    return [(e.type, e.kind) for e in events if start <= e.step and e.step + latency < end]


def recurrences(symptoms: Iterable[Symptom], replay_events: Iterable[Any], start: int, end: int) -> int:
    """Replay events in ``[start, end)`` of a symptom's type and kind, at any layer (a symptom
    that moved to another layer has not vanished)."""
    kinds = set(symptoms)
    return sum(1 for e in replay_events if (e.type, e.kind) in kinds and e.step < end and e.end_step >= start)


def reference_gain(original: Mapping[int, float], replayed: Mapping[int, float], start: int, end: int,
                   onset: int | None) -> float | None:
    """Mean :func:`relative_gain` of the reference records both runs made in the late part of
    ``[start, end)`` (all after ``start`` when none is that late; the record at ``start`` is
    the snapshot's and equal by construction). ``None`` without a paired record."""
    paired = [t for t in sorted(original) if start < t < end and t in replayed]
    late = [t for t in paired if t in late_steps(start, end, onset)] or paired
    if not late:
        return None
    return sum(relative_gain(original[t], replayed[t]) for t in late) / len(late)


def compare(original: Mapping[int, float], replayed: Mapping[int, float], start: int, end: int,
            onset: int | None, threshold: float = VANISHED_IMPROVEMENT, symptoms: Sequence[Symptom] = (),
            replay_events: Iterable[Any] = (),
            reference: tuple[Mapping[int, float], Mapping[int, float]] | None = None) -> Comparison:
    """Compare the replayed losses with the original ones over ``[start, end)``, the replay's
    events with the original's ``symptoms`` (paired windows only), and, when the run lost part
    of its reference task, the ``reference`` records ``(original, replayed)`` (module docstring)."""
    window = [t for t in range(start, end) if t in original and t in replayed]
    nf_before = sum(1 for t in window if not math.isfinite(original[t]))
    nf_after = sum(1 for t in window if not math.isfinite(replayed[t]))
    late = [t for t in late_steps(start, end, onset) if t in original and t in replayed]
    if not late:
        late = window[len(window) // 2:]
    gains = [relative_gain(original[t], replayed[t]) for t in late]
    imp = sum(gains) / len(gains) if gains else 0.0
    again = recurrences(symptoms, replay_events, start, end)
    # a change that silences the events but makes the loss clearly worse, or non-finite, has not
    # shown itself to be the fix: the same threshold that defines 'improved' defines 'worse'
    gone = bool(symptoms) and again == 0 and imp >= -threshold and nf_after <= nf_before
    ref = None if reference is None else reference_gain(*reference, start, end, onset)
    kept = ref is not None and ref + REFERENCE_TRADE * min(imp, 0.0) > threshold and nf_after <= nf_before
    return Comparison("vanished" if imp > threshold or gone or kept else "persisted", imp, len(gains), nf_before,
                      nf_after, len(symptoms), again, ref)


def loss_map(points: Iterable[tuple[int, float]]) -> dict[int, float]:
    """``step -> loss`` of a loss history (the last value wins for a repeated step)."""
    return {int(s): float(v) for s, v in points}
