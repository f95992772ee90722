"""Did the symptom vanish under the intervention? The replayed window against the original one.

The replay draws the same batches as the original run (``replay(model, optimizer, step)`` is
the user's step function, and the RNG state is restored with the snapshot), so the two loss
curves are paired step by step and their difference is the intervention's effect, not batch
noise. Each step's relative improvement is ``d = (orig - replay) / max(|orig|, |replay|)``,
in ``[-1, 1]`` whatever the loss' scale or sign, with the non-finite cases at the ends: ``+1``
when only the original is NaN/Inf, ``-1`` when only the replay is, ``0`` when both are.
The *improvement* is the mean of ``d`` over the late part of the window: from the onset on and
over its second half, where the effect of the changed updates has built up. The symptom
*vanished* when the improvement exceeds :data:`VANISHED_IMPROVEMENT`, else it *persisted*.
What these outcomes say about each root cause is not decided here: the likelihoods
``P(vanished | intervention, true cause)`` are fitted from benchmark runs
(:mod:`neuraldbg.verify.likelihoods`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

#: Mean relative improvement of the late window from which the symptom counts as vanished:
#: a twentieth of the loss (or a NaN curve turned finite on a twentieth of the late steps).
#: Set once, before any benchmark run was scored; what an outcome is worth per cause and
#: family is the fitted likelihoods' business.
VANISHED_IMPROVEMENT = 0.05
OUTCOMES = ("persisted", "vanished")


@dataclass(frozen=True)
class Comparison:
    """The paired comparison of one window."""

    outcome: str               # "vanished" or "persisted"
    improvement: float         # mean relative improvement over the late steps
    late_steps: int            # paired steps it averages
    nonfinite_before: int      # non-finite losses of the original in the window
    nonfinite_after: int       # ... and of the replay


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


def compare(original: Mapping[int, float], replayed: Mapping[int, float], start: int, end: int,
            onset: int | None, threshold: float = VANISHED_IMPROVEMENT) -> Comparison:
    """Compare the replayed losses with the original ones over ``[start, end)``."""
    window = [t for t in range(start, end) if t in original and t in replayed]
    nf_before = sum(1 for t in window if not math.isfinite(original[t]))
    nf_after = sum(1 for t in window if not math.isfinite(replayed[t]))
    late = [t for t in late_steps(start, end, onset) if t in original and t in replayed]
    if not late:
        late = window[len(window) // 2:]
    gains = [relative_gain(original[t], replayed[t]) for t in late]
    imp = sum(gains) / len(gains) if gains else 0.0
    return Comparison("vanished" if imp > threshold else "persisted", imp, len(gains), nf_before, nf_after)


def loss_map(points: Iterable[tuple[int, float]]) -> dict[int, float]:
    """``step -> loss`` of a loss history (the last value wins for a repeated step)."""
    return {int(s): float(v) for s, v in points}
