"""Collapsing (merge repeats) and compression (first occurrences, propagation order).

``collapse`` is a pure function over event lists; :class:`EventLog` applies the same merge
online so that a 20,000-step run keeps one record per episode, not one per step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from neuraldbg.events.base import Event


def merge(a: Event, b: Event) -> Event:
    """Merge ``b`` (later) into ``a``: first step and triggering values of ``a`` are kept."""
    return _extended(a, max(a.end_step, b.end_step), a.count + b.count, max(a.severity, b.severity))


def _extended(a: Event, end_step: int, count: int, severity: float) -> Event:
    """A copy of the validated ``a`` with its run's end, count and severity, each valid by
    construction: not dataclasses.replace, whose validation would run once per hit of a
    condition that persists (every layer of a deep stack whose gradients vanish, on every check)."""
    m = object.__new__(Event)
    m.__dict__.update(a.__dict__, end_step=end_step, count=count, severity=severity)
    return m


def collapse(events: Iterable[Event], gap: int = 0) -> list[Event]:
    """Merge runs of the same (type, kind, layer, rank) whose steps are within ``gap`` steps.

    An event joins the open run of its key when its step is at most ``end_step + gap``.
    The result is sorted by (step, layer); collapsing twice gives the same list.
    """
    open_runs: dict[tuple, int] = {}
    out: list[Event] = []
    for ev in sorted(events, key=_order_key):
        key = (*ev.key, ev.rank)
        idx = open_runs.get(key)
        if idx is not None and ev.step <= out[idx].end_step + gap:
            out[idx] = merge(out[idx], ev)
        else:
            open_runs[key] = len(out)
            out.append(ev)
    return sorted(out, key=_order_key)


def _depth(layer_index, layer) -> int:
    if layer is None:
        return 10**9
    idx = layer_index(layer)
    return 10**8 if idx is None else idx


def _order_key(ev: Event) -> tuple:
    return (ev.step, ev.end_step, ev.type, ev.kind, "" if ev.layer is None else ev.layer,
            -1 if ev.rank is None else ev.rank)


#: Separate episodes kept per (type, kind, layer, rank) before later ones are folded into
#: the last: a condition that flickers for 20,000 steps stays a few records, not thousands.
MAX_EPISODES = 16


class EventLog:
    """Online collapsing: ``add`` hits in step order; ``events`` is the collapsed list.

    Memory is bounded by the number of keys: after ``max_episodes`` episodes of a key, a
    new hit extends that key's last episode whatever the gap (``count`` keeps the total,
    ``end_step`` the last step), so a recurring condition reads as one long episode.

    A hit merged into an open run updates that run's last step, count and severity in place;
    the merged :class:`Event` (what :func:`merge` of every hit in turn gives) is made when
    ``events`` is read, so a condition that persists costs no object per hit.

    ``gaps`` overrides ``gap`` per event type: a layer statistic read once every few checks
    (rotating shares of a deep model's outputs) repeats that many checks apart, and must still
    merge into one run.
    """

    def __init__(self, gap: int, layer_index: Callable[[str | None], int | None] | None = None,
                 max_episodes: int = MAX_EPISODES, gaps: Mapping[str, int] | None = None) -> None:
        self.gap = gap
        self.gaps = dict(gaps or {})
        self.layer_index = layer_index
        self.max_episodes = max_episodes
        self._events: list[Event] = []   # each run's event as last read (its first hit until merged)
        self._runs: list[list] = []      # each run's [last step, count, severity] so far
        self._stale: set[int] = set()    # runs merged into since their event was made
        self._open: dict[tuple, int] = {}
        self._episodes: dict[tuple, int] = {}

    def add(self, ev: Event) -> None:
        """Add one hit, merging it into the open run of its key when close enough."""
        key = (ev.type, ev.kind, ev.layer, ev.rank)
        idx = self._open.get(key)
        if idx is not None:
            run = self._runs[idx]
            gap = self.gaps.get(ev.type, self.gap) if self.gaps else self.gap
            if ev.step <= run[0] + gap or self._episodes[key] >= self.max_episodes:
                # merge(): the later end, the counts added, the larger severity (max's tie rule)
                if ev.end_step > run[0]:
                    run[0] = ev.end_step
                run[1] += ev.count
                if ev.severity > run[2]:
                    run[2] = ev.severity
                self._stale.add(idx)
                return
        self._open[key] = len(self._events)
        self._episodes[key] = self._episodes.get(key, 0) + 1
        self._events.append(ev)
        self._runs.append([ev.end_step, ev.count, ev.severity])

    def _merged(self) -> list[Event]:
        for idx in self._stale:
            self._events[idx] = _extended(self._events[idx], *self._runs[idx])
        self._stale.clear()
        return self._events

    @property
    def events(self) -> list[Event]:
        """Collapsed events in step order (same step: input side first, loss events last)."""
        events = self._merged()
        if self.layer_index is None:
            return sorted(events, key=_order_key)
        return sorted(events, key=lambda e: (e.step, _depth(self.layer_index, e.layer), _order_key(e)))

    def __len__(self) -> int:
        return len(self._events)


@dataclass(frozen=True)
class Propagation:
    """How one event kind spread: the first layer, then each next layer, by first step."""

    type: str
    kind: str
    first: Event
    order: tuple[tuple[str | None, int], ...]  # (layer, first step) in order of appearance

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {"type": self.type, "kind": self.kind, "first": self.first.to_dict(),
                "order": [list(x) for x in self.order]}


def compress(events: Sequence[Event], layer_index: Callable[[str | None], int | None] | None = None
             ) -> list[Propagation]:
    """First occurrence of each (type, kind) and its propagation order across layers.

    Ties on the same step are broken by forward order (input side first) when
    ``layer_index`` is given, so "which layer first" follows the data flow.
    """
    def rank(ev: Event) -> tuple:
        idx = layer_index(ev.layer) if layer_index else None
        return (ev.step, -1 if ev.layer is None else (idx if idx is not None else 10**9))

    by_kind: dict[tuple[str, str], list[Event]] = {}
    for ev in events:
        by_kind.setdefault((ev.type, ev.kind), []).append(ev)
    out = []
    for (type_, kind), evs in by_kind.items():
        evs = sorted(evs, key=rank)
        seen: dict[str | None, int] = {}
        for ev in evs:
            seen.setdefault(ev.layer, ev.step)
        out.append(Propagation(type_, kind, evs[0], tuple(seen.items())))
    return sorted(out, key=lambda p: rank(p.first))
