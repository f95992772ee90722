"""What a diagnosis did not see, in words: shared by ``neuraldbg explain`` and the HTML report.

A diagnosis is only as good as what it observed (``docs/api.md``, "Coverage"). Every output
that states a verdict also says which evidence variables it did not observe and why, grouped by
reason so that nineteen variables missing for one cause read as one line; the monitor's own
internal errors; and, when nothing at all was observed, that the posterior is the prior and no
finding about the run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: heading of the variables the monitor did not measure (a gap: the run could have shown them)
MISSED = "missed by the monitor"
#: heading of the variables this run could not show (no ReLU to die, no reference loss given)
NOT_SHOWN = "not shown by this run"


@dataclass(frozen=True)
class Group:
    """Unobserved variables that share one ``reason``; ``gap``: the monitor did not measure them."""

    reason: str
    variables: tuple[str, ...]
    gap: bool


def groups(coverage: Any) -> list[Group]:
    """The unobserved variables of a :class:`~neuraldbg.causal.types.Coverage`, one group per
    reason: the monitor's gaps first, then what the run could not show; each in network order."""
    by_reason: dict[tuple[bool, str], list[str]] = {}
    for var, c in coverage.items():
        if not c.observed:
            by_reason.setdefault((bool(c.gap), c.reason or "no reason recorded"), []).append(var)
    keys = sorted(by_reason, key=lambda k: not k[0])  # stable: first-seen order within each kind
    return [Group(reason, tuple(by_reason[(gap, reason)]), gap) for gap, reason in keys]


def errors_sentence(n: int) -> str:
    """The monitor's internal errors, pointing at the log that holds their tracebacks ("" for 0)."""
    if n <= 0:
        return ""
    return (f"The monitor hit {n} internal error{'s' if n != 1 else ''}; see the log (the neuraldbg "
            "logger) for what it could not measure.")


def nothing_sentence(p_prior: float) -> str:
    """The verdict of a run in which nothing was observed: none, with the prior's number named as
    such so that it cannot be read as a finding."""
    return (f"Nothing was observed (no loss and no layer statistics): no diagnosis. The prior alone "
            f"gives P(healthy) = {p_prior:.2f}, which says nothing about this run.")


def verdict(posterior: Any) -> str:
    """One line: ``P(healthy) = p: healthy`` / ``not healthy`` (``P(healthy) >= 0.5``, the one
    verdict of ``docs/api.md``), or :func:`nothing_sentence` when nothing was observed."""
    if getattr(posterior, "nothing_observed", False):
        return nothing_sentence(posterior.p_healthy)
    return f"P(healthy) = {posterior.p_healthy:.3f}: {'healthy' if posterior.is_healthy else 'not healthy'}"


def text_lines(coverage: Any, indent: str = "  ") -> list[str]:
    """The "Not observed" section as text lines (none when everything was observed and the
    monitor had no internal error)."""
    out: list[str] = []
    gs = groups(coverage)
    if gs:
        n = sum(len(g.variables) for g in gs)
        out.append(f"Not observed: {'all' if n == len(coverage) else n} of {len(coverage)} evidence variables")
        for gap in (True, False):
            mine = [g for g in gs if g.gap == gap]
            if mine:
                out.append(f"{indent}{MISSED if gap else NOT_SHOWN}:")
                out += [f"{indent * 2}{', '.join(g.variables)}: {g.reason}" for g in mine]
    errors = errors_sentence(coverage.internal_errors)
    if errors:
        out.append(errors)
    return out
