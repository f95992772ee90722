"""The event record shared by detectors, the causal engine and exports.

An :class:`Event` is a *transition* (healthy -> vanishing in ``fc1`` at step 212), never a
row per step. It is frozen and holds plain Python values only, so it can be hashed,
compared, pickled and written to JSON without touching torch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from collections.abc import Mapping
from typing import Any, Iterable, Sequence

from neuraldbg.vocab import (ACTIVATION, DATA, EVENT_KINDS, EVENT_TYPES, FAILURE_TYPES, GRADIENT,  # noqa: F401
                             OPTIMIZER, validate_failure_type)


@dataclass(frozen=True)
class Event:
    """One semantic transition seen in a training run.

    ``values`` holds the measured numbers that triggered the event as sorted
    ``(name, value)`` pairs (a tuple keeps the record hashable); ``measured`` gives a dict.
    """

    type: str
    kind: str
    layer: str | None
    step: int
    end_step: int | None = None
    count: int = 1
    severity: float = 0.0
    values: tuple[tuple[str, float], ...] = ()
    rank: int | None = None

    def __post_init__(self) -> None:
        if self.type not in EVENT_KINDS:
            raise ValueError(f"unknown event type {self.type!r}; valid: {', '.join(EVENT_TYPES)}")
        if self.kind not in EVENT_KINDS[self.type]:
            raise ValueError(
                f"kind {self.kind!r} is not valid for {self.type}; valid: {', '.join(EVENT_KINDS[self.type])}"
            )
        if self.end_step is None:
            object.__setattr__(self, "end_step", self.step)
        if self.end_step < self.step:
            raise ValueError(f"end_step {self.end_step} precedes step {self.step}")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if isinstance(self.values, Mapping):
            object.__setattr__(self, "values", _freeze_values(self.values))

    @property
    def measured(self) -> dict[str, float]:
        """The triggering values as a dict."""
        return dict(self.values)

    @property
    def key(self) -> tuple[str, str, str | None]:
        """(type, kind, layer): what collapsing groups on."""
        return (self.type, self.kind, self.layer)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``values`` as a mapping)."""
        d = asdict(self)
        d["values"] = dict(self.values)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Event":
        """Inverse of :meth:`to_dict`."""
        known = {"type", "kind", "layer", "step", "end_step", "count", "severity", "values", "rank"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown event fields {sorted(unknown)}; valid: {sorted(known)}")
        return cls(
            type=d["type"],
            kind=d["kind"],
            layer=d.get("layer"),
            step=int(d["step"]),
            end_step=int(d.get("end_step", d["step"])),
            count=int(d.get("count", 1)),
            severity=float(d.get("severity", 0.0)),
            values=_freeze_values(d.get("values", {})),
            rank=d.get("rank"),
        )

    def __str__(self) -> str:
        where = self.layer if self.layer is not None else "loss"
        span = f"step {self.step}" if self.end_step == self.step else f"steps {self.step}-{self.end_step}"
        rank = f" [rank {self.rank}]" if self.rank is not None else ""
        return f"{self.kind} ({self.type}) in {where} at {span}{rank}, severity {self.severity:.3g}"


def _freeze_values(values: Mapping[str, float] | Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    items = values.items() if isinstance(values, Mapping) else values
    return tuple(sorted((str(k), float(v)) for k, v in items))


#: the valid (type, kind) pairs, for make_event's direct path
_VALID_KINDS = frozenset((t, k) for t, kinds in EVENT_KINDS.items() for k in kinds)


def make_event(type: str, kind: str, layer: str | None, step: int, severity: float,
               values: Mapping[str, float] | None = None, **kw: Any) -> Event:
    """Build an :class:`Event` from a values dict (detectors' shorthand)."""
    if kw or (type, kind) not in _VALID_KINDS:  # the validating constructor names what is valid
        return Event(type=type, kind=kind, layer=layer, step=int(step), severity=float(severity),
                     values=_freeze_values(values or {}), **kw)
    return _hit(type, kind, layer, int(step), float(severity), _freeze_values(values or {}))


def _hit(type: str, kind: str, layer: str | None, step: int, severity: float,
         values: tuple[tuple[str, float], ...]) -> Event:
    """An :class:`Event` of one hit, valid by construction (a known kind, end_step = step,
    count 1, frozen values): the frozen dataclass's __init__ and checks cost more than the rest
    of a hit, and a condition that persists on every layer of a deep stack is one hit per layer
    per check."""
    ev = object.__new__(Event)
    ev.__dict__.update(type=type, kind=kind, layer=layer, step=step, end_step=step, count=1,
                       severity=severity, values=values, rank=None)
    return ev


def make_events(type: str, kind: str, layers: Sequence[str | None], step: int, severities: Sequence[float],
                columns: Mapping[str, Sequence[float]]) -> list[Event]:
    """:func:`make_event` for several layers at one step: ``columns`` holds each value's numbers
    in the layers' order. The same events, with the kind checked and the names sorted once (a
    condition that persists on every layer of a deep stack is a hit per layer per check)."""
    names = sorted(str(k) for k in columns)
    cols = [[float(v) for v in columns[k]] for k in names]
    if (type, kind) not in _VALID_KINDS:  # the validating constructor names what is valid
        return [make_event(type, kind, layer, step, sev, dict(zip(names, vals)))
                for layer, sev, *vals in zip(layers, severities, *cols)]
    step = int(step)
    return [_hit(type, kind, layer, step, float(sev), tuple(zip(names, vals)))
            for layer, sev, *vals in zip(layers, severities, *cols)]
