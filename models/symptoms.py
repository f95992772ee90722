"""Did an injection break its run? Checks on the run's own signals, never on NeuralDBG.

Every check compares a faulty run with the healthy run of the same arch, seed and length,
using relative criteria (fractions of the healthy run's own improvement, multiples of its
own loss level), so nothing is tuned to one seed's numbers. The benchmark can use
:func:`check` as a sanity column; the tests use it for every injection.
"""
from __future__ import annotations

import math
from typing import Sequence

from models.runner import RunResult


def _finite(xs: Sequence[float]) -> bool:
    return all(math.isfinite(x) for x in xs)


def _k(n: int, frac: float = 0.1) -> int:
    return max(3, int(round(frac * n))) if n >= 6 else max(1, n // 2)


def head(xs: Sequence[float], frac: float = 0.1) -> float:
    """Mean of the first ``frac`` of ``xs`` (at least 3 points)."""
    xs = list(xs)
    return sum(xs[: _k(len(xs), frac)]) / _k(len(xs), frac)


def tail(xs: Sequence[float], frac: float = 0.1) -> float:
    """Mean of the last ``frac`` of ``xs`` (at least 3 points)."""
    xs = list(xs)
    return sum(xs[-_k(len(xs), frac):]) / _k(len(xs), frac)


def improvement(r: RunResult) -> float:
    """How much the run's progress series improved, head to tail (-inf if it went non-finite)."""
    name, direction = r.progress
    xs = r.series(name)
    if not xs or not _finite(xs[-_k(len(xs)):]):
        return -math.inf
    d = head(xs) - tail(xs)
    return d if direction == "down" else -d


def gain_from(r: RunResult, start: float) -> float:
    """How far the run's progress series ends better than ``start`` (-inf if non-finite)."""
    name, direction = r.progress
    xs = r.series(name)
    if not xs or not _finite(xs[-_k(len(xs)):]):
        return -math.inf
    d = start - tail(xs)
    return d if direction == "down" else -d


def learns(r: RunResult, margin: float = 0.3) -> tuple[bool, str]:
    """A healthy run: finite, and its progress series improves by ``margin`` of its start."""
    name, direction = r.progress
    xs = r.series(name)
    if not _finite(r.losses):
        return False, f"non-finite loss at step {r.first_nonfinite_step}"
    h, t = head(xs), tail(xs)
    gain = improvement(r)
    ok = gain > margin * abs(h)
    return ok, f"{name} {h:.3g} -> {t:.3g} (improvement {gain:.3g}, needed > {margin * abs(h):.3g})"


def check(r: RunResult, healthy: RunResult) -> tuple[bool, str]:
    """Whether ``r`` shows its injection's ``symptom``, relative to ``healthy``; and why."""
    s = r.symptom
    L, H = r.losses, healthy.losses
    nf = r.first_nonfinite_step
    gain, hgain = improvement(r), improvement(healthy)
    h0 = head(H)
    if s == "none":
        return learns(r)
    if s == "nonfinite":
        onset = r.onset or 0
        ok = nf is not None and nf >= onset and _finite(L[:onset])
        return ok, f"first non-finite loss at {nf}, onset {onset}"
    if s == "diverges":
        finite = [x for x in L if math.isfinite(x)]
        peak = max(finite) if finite else math.inf
        ok = nf is not None or peak > 10 * h0 or tail(L) > 2 * h0
        return ok, (f"non-finite at {nf}, peak {peak:.3g}, tail {tail(L):.3g} "
                    f"vs healthy start {h0:.3g}")
    if s == "jump":
        onset = r.onset or 0
        w = _k(len(L))
        before = L[max(0, onset - w):onset]
        after = L[onset:onset + w]
        if nf is not None and nf >= onset:
            return _finite(L[:onset]), f"non-finite from step {nf} (onset {onset})"
        b = sum(before) / max(1, len(before))
        ok = (_finite(L[:onset]) and max(after) > 1.5 * b
              and max(after) > 1.2 * max(H[onset:onset + w]))
        return ok, f"loss {b:.3g} before the onset, peak {max(after):.3g} after"
    if s == "no_skill":
        # the loss is not the healthy run's (another kind, another scale): the task's own
        # held-out accuracy is the measure both runs share
        a, ha = r.metrics.get("test_accuracy"), healthy.metrics.get("test_accuracy")
        ok = a is not None and ha is not None and a < 0.5 * ha
        return ok, f"held-out accuracy {a} vs healthy {ha} (needs < half)"
    if s == "stuck":
        ok = math.isfinite(gain) and gain < 0.2 * hgain
        return ok, f"improvement {gain:.3g} vs healthy {hgain:.3g} (needs < 20%)"
    if s == "worse":
        # measured from the healthy run's start, so a run that merely starts high (a large
        # init) and comes down to where the healthy one started does not count as learning
        hstart = head(healthy.series(healthy.progress[0]))
        g = gain_from(r, hstart)
        ok = g < 0.75 * hgain
        return ok, (f"ends {g:.3g} better than the healthy start vs healthy {hgain:.3g} "
                    "(needs < 75%)")
    if s == "forgetting":
        a, ha = r.series("task_a_loss"), healthy.series("task_a_loss")
        a0 = r.metrics.get("task_a_before", a[0])
        ha0 = healthy.metrics.get("task_a_before", ha[0])
        rise, hrise = tail(a, 0.2) - a0, tail(ha, 0.2) - ha0
        ok = math.isfinite(rise) and rise > max(2 * hrise, 0.5)
        return ok, f"task-A loss rose {rise:.3g} vs healthy {hrise:.3g}"
    if s == "entropy_collapse":
        e, he = r.series("entropy"), healthy.series("entropy")
        # against the healthy run's starting entropy: a collapse can happen in the first steps
        ok = (math.isfinite(tail(e)) and tail(e) < 0.25 * head(he) and tail(e) < 0.5 * tail(he)
              and gain < 0.5 * hgain)
        return ok, (f"entropy ends {tail(e):.3g} (healthy {head(he):.3g} -> {tail(he):.3g}), "
                    f"improvement {gain:.3g} vs healthy {hgain:.3g}")
    if s == "attention_collapse":
        e, he = r.series("attention_entropy"), healthy.series("attention_entropy")
        ok = tail(e) < 0.25 * tail(he) and gain < hgain
        return ok, f"attention entropy ends {tail(e):.3g} vs healthy {tail(he):.3g}"
    raise ValueError(f"unknown symptom {s!r}")
