"""What a monitored run leaves behind, independent of torch: the input of the causal engine.

A :class:`Trace` is built by :class:`neuraldbg.NeuralDbg` (live) or read back from an export
(:func:`neuraldbg.load_session`); the causal queries only ever see a ``Trace``.

Besides events, a trace carries the run's *signatures*: numbers measured directly (the weight
scale on entry, the step size over the first checked steps, a reference loss...), each under a
declared :class:`Signature` that says its type and range, when it is measured and how the
ranks of a distributed run merge it. Every signature is declared once, next to the evidence
node that reads it (``neuraldbg/causal/nodes/``; ``docs/architecture.md``); readers name it by
its declaration, never by a string, so a misspelt name is an error, not an unobserved variable.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from neuraldbg.events.base import Event

#: value kinds of a signature: a number, an integer, a text (or null), lists of numbers / integers
KINDS = ("number", "integer", "text", "numbers", "integers")
#: when a signature is measured: on entry (before the first update), over a window of the first
#: checked steps, or over the whole run (known only at its end)
WHEN = ("entry", "window", "run")
#: how the ranks of a distributed run merge a signature: the lowest rank's value, the smallest,
#: the largest, the median or the sum over ranks, or 1 when any rank has a non-zero value
MERGES = ("lead", "min", "max", "median", "sum", "any")


@dataclass(frozen=True)
class Signature:
    """The declaration of one measured quantity a trace may carry."""

    name: str
    kind: str
    when: str
    merge: str
    doc: str
    lo: float = -math.inf
    hi: float = math.inf

    def __post_init__(self) -> None:
        for what, value, valid in (("kind", self.kind, KINDS), ("when", self.when, WHEN),
                                   ("merge", self.merge, MERGES)):
            if value not in valid:
                raise ValueError(f"signature {self.name}: {what} {value!r} is not valid; valid: {', '.join(valid)}")
        if self.merge not in ("lead",) and self.kind in ("text", "numbers", "integers"):
            raise ValueError(f"signature {self.name}: a {self.kind} merges only as 'lead'")

    def check(self, value: Any) -> Any:
        """``value`` normalized (lists to tuples, integers as ``int``); ``ValueError`` naming the
        signature and what is valid otherwise."""
        if self.kind == "text":
            if value is not None and not isinstance(value, str):
                raise ValueError(f"signature {self.name} must be a text or None, got {value!r}")
            return value
        if self.kind in ("numbers", "integers"):
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"signature {self.name} must be a list of {self.kind}, got {value!r}")
            return tuple(self._scalar(x, self.kind == "integers") for x in value)
        return self._scalar(value, self.kind == "integer")

    def _scalar(self, x: Any, integer: bool) -> float | int:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"signature {self.name} must hold {'integers' if integer else 'numbers'}, got {x!r}")
        if integer:
            if isinstance(x, float) and not x.is_integer():
                raise ValueError(f"signature {self.name} must hold integers, got {x!r}")
            x = int(x)
        if math.isfinite(x) and not self.lo <= x <= self.hi:
            raise ValueError(f"signature {self.name} = {x!r} is out of range; valid: {self.lo} to {self.hi}")
        return x if integer else float(x)


class Signatures:
    """The signatures of one trace: a frozen, declared mapping read by declaration.

    ``values`` maps a :class:`Signature` (or its name, for the table-checked readers of files)
    to its value, ``steps`` to the step by which it was measured (``None``: its ``when`` decides,
    see :meth:`known_by`), ``gaps`` a signature the run did not measure to the reason (no
    optimizer found, not at initialization, an unsupported tensor type...). Reads take the
    declaration itself, so a typo cannot silently read nothing. Building one does not check the
    values against the table: the monitor, the session reader and the merge do that
    (:func:`neuraldbg.causal.nodes.check_signature`).
    """

    __slots__ = ("_values", "_steps", "_gaps")

    def __init__(self, values: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = (),
                 steps: Mapping[Any, int | None] | None = None, gaps: Mapping[Any, str] | None = None) -> None:
        items = values.items() if isinstance(values, Mapping) else values
        self._values: dict[str, Any] = {_name(k): (tuple(v) if isinstance(v, list) else v) for k, v in items}
        self._steps: dict[str, int] = {_name(k): int(s) for k, s in (steps or {}).items()
                                       if s is not None and _name(k) in self._values}
        self._gaps: dict[str, str] = {_name(k): str(r) for k, r in (gaps or {}).items()
                                      if _name(k) not in self._values}

    # ---- reading ---------------------------------------------------------------------
    def value(self, sig: Signature, default: Any = None) -> Any:
        """The value of ``sig`` (``default`` when the run did not measure it)."""
        return self._values.get(_declared(sig), default)

    def number(self, sig: Signature) -> float | None:
        """The value of ``sig`` as a finite float, else ``None`` (unmeasured, or not finite)."""
        v = self._values.get(_declared(sig))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        return float(v)

    def step(self, sig: Signature) -> int | None:
        """The step by which ``sig`` was measured, when recorded."""
        return self._steps.get(_declared(sig))

    def gap(self, sig: Signature) -> str | None:
        """Why ``sig`` was not measured, when the run knows (``None``: measured, or no reason)."""
        return self._gaps.get(_declared(sig))

    def __contains__(self, sig: object) -> bool:
        return isinstance(sig, Signature) and sig.name in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __bool__(self) -> bool:
        return bool(self._values)

    def names(self) -> Iterator[str]:
        """The measured names, sorted."""
        return iter(sorted(self._values))

    def items(self) -> list[tuple[str, Any]]:
        """``(name, value)`` pairs, sorted by name (what files and displays read)."""
        return sorted(self._values.items())

    def steps(self) -> dict[str, int]:
        """The recorded measurement steps, by name."""
        return dict(self._steps)

    def gaps(self) -> dict[str, str]:
        """Why each unmeasured signature was not measured, by name."""
        return dict(self._gaps)

    def as_dict(self) -> dict[str, Any]:
        """A plain ``{name: value}`` copy (lists as tuples), for display."""
        return dict(self.items())

    # ---- deriving ----------------------------------------------------------------------
    def known_by(self, step: int, table: Mapping[str, Signature], first: int, last: int) -> "Signatures":
        """The signatures a live monitor had at ``step`` of a run observed over ``[first, last]``:
        each one measured by then. Without a recorded step, an ``entry`` signature is known from
        ``first``, a ``window`` or ``run`` one only at ``last`` (never earlier than it could be)."""
        keep, steps = {}, {}
        for name, v in self._values.items():
            at = self._steps.get(name)
            if at is None:
                at = first if table[name].when == "entry" else last
            if at <= step:
                keep[name], steps[name] = v, at
        return Signatures(keep, steps, self._gaps)

    def updated(self, values: Mapping[Any, Any], steps: Mapping[Any, int | None] | None = None,
                gaps: Mapping[Any, str] | None = None) -> "Signatures":
        """A copy with ``values`` (and their steps, and ``gaps``) set."""
        merged = dict(self._values)
        merged.update((_name(k), v) for k, v in values.items())
        all_steps: dict[Any, int | None] = {**self._steps, **{_name(k): s for k, s in (steps or {}).items()}}
        return Signatures(merged, all_steps, {**self._gaps, **{_name(k): r for k, r in (gaps or {}).items()}})

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Signatures) and self._values == other._values and self._steps == other._steps
                and self._gaps == other._gaps)

    def __hash__(self) -> int:
        return hash(tuple(self.items()))

    def __repr__(self) -> str:
        return f"Signatures({self.as_dict()!r})"


def _name(key: Any) -> str:
    if isinstance(key, Signature):
        return key.name
    if isinstance(key, str):
        return key
    raise TypeError(f"a signature is named by its declaration (or name), got {type(key).__name__}")


def _declared(sig: Any) -> str:
    if not isinstance(sig, Signature):
        raise TypeError(f"signatures are read by their declaration (a neuraldbg.trace.Signature), not "
                        f"{type(sig).__name__} {sig!r}: a misspelt name must not read as 'not measured'")
    return sig.name


def merge_values(sig: Signature, values: list[Any]) -> Any:
    """The ranks' ``values`` of ``sig`` (lowest rank first) merged by its declared rule."""
    if sig.merge == "lead" or len(values) == 1:
        return values[0]
    nums = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not nums:
        return values[0]
    if sig.merge == "min":
        out = min(nums)
    elif sig.merge == "max":
        out = max(nums)
    elif sig.merge == "median":
        out = statistics.median(nums)
    elif sig.merge == "sum":
        out = math.fsum(nums)
    else:  # any
        out = 1.0 if any(nums) else 0.0
    return int(round(out)) if sig.kind == "integer" else out


@dataclass(frozen=True)
class LayerInfo:
    """A monitored leaf module: qualified name, class name, and position in forward order.

    ``role`` says what it does when that changes a reading (``neuraldbg/monitor/roles.py``):
    ``"norm"`` (a normalization layer, whatever its class), ``"attn_qk"`` (an attention query or
    key projection) or ``""``.
    """

    name: str
    type: str
    index: int
    n_params: int = 0
    role: str = ""


@dataclass(frozen=True)
class LossSummary:
    """Compact loss history: a few anchors plus a downsampled curve (``history``)."""

    n: int = 0
    first: float | None = None
    last: float | None = None
    min: float | None = None
    n_nonfinite: int = 0
    first_nonfinite_step: int | None = None
    history: tuple[tuple[int, float], ...] = ()  # (step, loss), downsampled


#: ``CadenceRecord.every`` of a cadence the monitor chose itself (``every="auto"``)
CADENCE_AUTO = "auto"
#: the interval an ``"auto"`` cadence checks at between its dense start and its first estimate
#: (a check, the step after it that runs the checked update, and unchecked steps to time)
CADENCE_PROBE = 4
#: every probe interval a recorded cadence may show (sessions written before the check was timed
#: with the step after it probed every 2nd step)
CADENCE_PROBES = frozenset({2, CADENCE_PROBE})


@dataclass(frozen=True)
class CadenceRecord:
    """Which steps the monitor checked (``neuraldbg/monitor/cadence.py``).

    ``every`` is the setting (an int, or ``"auto"``); ``budget`` the overhead budget of
    ``"auto"`` (``None`` for a fixed interval); ``changes`` the interval in force from each step
    on, ``(from_step, interval)`` in step order, the first at the run's first step (interval 1
    for a dense window); ``alarms`` the anomalies that made an ``"auto"`` cadence dense again,
    ``(anomaly's step, first dense step, why)``. The first and the latest changes are kept, the
    first alarms; ``changes_omitted`` and ``alarms_omitted`` count those left out.
    """

    every: int | str
    budget: float | None = None
    changes: tuple[tuple[int, int], ...] = ()
    alarms: tuple[tuple[int, int, str], ...] = ()
    changes_omitted: int = 0
    alarms_omitted: int = 0

    def interval_at(self, step: int) -> int:
        """The interval in force at ``step`` (the first one before the first change)."""
        interval = self.changes[0][1] if self.changes else 1
        for at, n in self.changes:
            if at > step:
                break
            interval = n
        return interval

    def next_checked(self, step: int) -> int:
        """The first step at or after ``step`` that was checked: the next multiple of the interval
        in force, unless a change comes first (a dense window checks its first step). Where the
        record omitted changes, the interval around them is the one kept before."""
        while True:
            n = self.interval_at(step)
            multiple = -(-step // n) * n
            later = [at for at, _ in self.changes if step < at <= multiple]
            if not later:
                return multiple
            step = later[0]

    def max_interval(self, first: int, last: int) -> int:
        """The largest interval in force over steps ``first..last``."""
        return max([self.interval_at(first)] + [n for at, n in self.changes if first < at <= last])


@dataclass(frozen=True)
class Trace:
    """Events plus the context needed to interpret them.

    ``layers`` is in forward execution order (first call), so index 0 is the input side.
    ``first_step``/``last_step`` bound the observed steps; ``signatures`` holds the measured
    signatures (see :class:`Signatures`) and why others were not measured; ``internal_errors``
    counts the monitor's own failures.
    """

    events: tuple[Event, ...]
    layers: tuple[LayerInfo, ...]
    family: str
    first_step: int = 0
    last_step: int = 0
    loss: LossSummary = field(default_factory=LossSummary)
    rank: int | None = None
    world_size: int | None = None
    signatures: Signatures = field(default_factory=Signatures)
    #: failures of the monitor's own code during the run (each was logged; the parts that failed
    #: read "a monitor error" in the signatures' gaps)
    internal_errors: int = 0
    #: which steps were checked (``None``: the trace does not say, e.g. a session before version 6)
    cadence: CadenceRecord | None = None

    @property
    def n_steps(self) -> int:
        """Number of observed steps (inclusive span)."""
        return max(0, self.last_step - self.first_step + 1)

    def layer_index(self, name: str | None) -> int | None:
        """Forward-order index of a layer, ``None`` for loss events or unknown names."""
        if name is None:
            return None
        for info in self.layers:
            if info.name == name:
                return info.index
        return None

    def relative_depth(self, name: str | None) -> float | None:
        """Position of a layer in 0 (input side) .. 1 (output side)."""
        idx = self.layer_index(name)
        if idx is None or not self.layers:
            return None
        n = max(info.index for info in self.layers)
        return 0.0 if n == 0 else idx / n
