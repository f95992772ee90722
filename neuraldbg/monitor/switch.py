"""Hooks that leave the model during unchecked steps, so that those steps run at bare speed.

A registered hook costs its module a slower call path in torch even when it returns at once;
on a deep model of small layers that alone is a tenth of the step. :class:`HookSwitch` takes
the monitor's per-module and per-parameter hooks out of torch's hook dicts when an unchecked
step starts and puts them back (same handle id) when a checked one does, so an unchecked step
runs no Python of the monitor per module or per parameter. Their handles stay valid
throughout: removing a paused hook is a no-op on the dict and forgets it here.

Hooks are kept in *groups*: group ``None`` is in on every checked step; the numbered groups
are the rotating shares of a model with many modules (``DetectorConfig.rotate_modules_above``),
of which one is in per checked step. A transition touches only the hooks that change state:
a dict insert or pop each, no Python call per module on the steps in between.
Under ``torch.compile`` each state is a guarded graph, compiled once.
"""
from __future__ import annotations

from typing import Any, Iterable

#: the group of hooks that are in on every checked step
ALWAYS = None
#: ``set(True, EVERY_GROUP)``: every group in (before the forward order is known)
EVERY_GROUP = "every group"


class HookSwitch:
    """The switchable hooks of one monitor, by group (group -> handle id -> (handle, hook function))."""

    def __init__(self) -> None:
        self.groups: dict[Any, dict[int, tuple[Any, Any]]] = {}
        self.live: frozenset = frozenset((ALWAYS,))  # the groups whose hooks are in the model now
        self.every_group = True  # and every group added later (as on registration)
        self._group_of: dict[int, Any] = {}
        # group -> [(hooks dict, handle id, hook)]: the dicts held directly, so that a transition
        # costs a dict operation per hook and no weak-reference call (a few hundred per check on
        # a deep model); dropped when the group changes
        self._targets: dict[Any, list[tuple[dict, int, Any]]] = {}

    @property
    def paused(self) -> bool:
        """Whether every hook is out of the model."""
        return not self.live

    def add(self, handle: Any, fn: Any, group: Any = ALWAYS) -> None:
        """Make ``handle``'s hook switchable in ``group`` (taken out at once unless that group is in)."""
        self.groups.setdefault(group, {})[handle.id] = (handle, fn)
        self._group_of[handle.id] = group
        self._targets.pop(group, None)
        if self.every_group:
            self.live = self.live | {group}
        elif group not in self.live:
            _take_out(handle)

    def forget(self, handles: Iterable[Any]) -> None:
        """Stop switching these handles (they were removed)."""
        for h in handles:
            hid = getattr(h, "id", None)
            group = self._group_of.pop(hid, None)
            self.groups.get(group, {}).pop(hid, None)
            self._targets.pop(group, None)

    def set(self, on: bool, group: Any = ALWAYS) -> None:
        """Put the hooks of group ``None`` and of ``group`` (every group: :data:`EVERY_GROUP`) in
        (``on``), or every hook out; only the groups that change state are touched."""
        if not on and not self.live:
            return  # an unchecked step after an unchecked step: the common case, kept cheapest
        every = on and group == EVERY_GROUP
        want = frozenset((ALWAYS, *self.groups)) if every else frozenset((ALWAYS, group)) if on else frozenset()
        self.every_group = every
        if want == self.live:
            return
        for g in self.live - want:
            for d, hid, _ in self._targets_of(g):
                d.pop(hid, None)
        for g in want - self.live:
            for d, hid, fn in self._targets_of(g):
                d[hid] = fn
        self.live = want

    def _targets_of(self, group: Any) -> list[tuple[dict, int, Any]]:
        got = self._targets.get(group)
        if got is None:
            got = []
            for h, fn in self.groups.get(group, {}).values():
                d = h.hooks_dict_ref()
                if d is not None:
                    got.append((d, h.id, fn))
            self._targets[group] = got
        return got


def _take_out(handle: Any) -> None:
    d = handle.hooks_dict_ref()
    if d is not None:
        d.pop(handle.id, None)
