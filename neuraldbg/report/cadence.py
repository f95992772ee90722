"""The sentence a report writes about which steps the monitor checked (a trace's
:class:`~neuraldbg.trace.CadenceRecord`, chosen by ``neuraldbg/monitor/cadence.py``). Pure."""
from __future__ import annotations

from neuraldbg.trace import CADENCE_AUTO as AUTO, CADENCE_PROBES, CadenceRecord


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``7th``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _every_text(n: int) -> str:
    return "every step" if n == 1 else f"every {ordinal(n)} step"


def _aside(parts: list[str]) -> str:
    return f" ({'; '.join(parts)})" if parts else ""


def describe(record: CadenceRecord | None) -> str:
    """The cadence of a run in one sentence, as the report writes it: "Checked every step for the
    first 32 steps, then every 7th step (budget 3 %); dense again after the loss spike at step
    212." An empty string for ``None`` (a trace that does not say)."""
    if record is None or not record.changes:
        return ""
    if record.every != AUTO:
        return f"Checked {_every_text(int(record.every))}."
    changes = list(record.changes)
    budget = [f"budget {record.budget * 100:g} %"] if record.budget is not None else []
    if len(changes) == 1:
        return f"Checked every step{_aside(budget)}."
    start = changes[1][0] - changes[0][0]
    # the dense windows after anomalies are said below, with their cause
    dense_after = {at for _, at, _ in record.alarms}
    sparse = [n for s, n in changes[1:] if s not in dense_after] or [1]
    if len(sparse) > 1 and changes[1][1] in CADENCE_PROBES:
        sparse = sparse[1:]  # the probe's steps, checked while the first timings came in
    text = f"Checked every step for the first {start} steps, then "
    lo, hi, last = min(sparse), max(sparse), sparse[-1]
    text += _every_text(last)
    span = [f"from {_every_text(lo)} to {_every_text(hi)} over the run"] if lo != hi else []
    text += _aside(span + budget)
    if record.alarms:
        step, _, why = record.alarms[0]
        more = len(record.alarms) - 1 + record.alarms_omitted
        text += f"; dense again after the {why} at step {step}" + (
            f" and after {more} more anomal{'y' if more == 1 else 'ies'}" if more else "")
    return text + "."
