"""Hooks that leave the model during unchecked steps, so that those steps run at bare speed.

A registered hook costs its module a slower call path in torch even when it returns at once;
on a small model that alone is about a percent of the step. :class:`HookSwitch` takes the
monitor's per-module and per-parameter hooks out of torch's hook dicts when an unchecked
step starts and puts them back (same handle id) when a checked one does. Their handles stay
valid throughout: removing a paused hook is a no-op on the dict and forgets it here.
Under ``torch.compile`` the two states are two guarded graphs, each compiled once.
"""
from __future__ import annotations

from typing import Any, Iterable


class HookSwitch:
    """The switchable hooks of one monitor (handle id -> (handle, hook function))."""

    def __init__(self) -> None:
        self.hooks: dict[int, tuple[Any, Any]] = {}
        self.paused = False

    def add(self, handle: Any, fn: Any) -> None:
        """Make ``handle``'s hook switchable (taken out at once while paused)."""
        self.hooks[handle.id] = (handle, fn)
        if self.paused:
            self._take_out(handle)

    def forget(self, handles: Iterable[Any]) -> None:
        """Stop switching these handles (they were removed)."""
        for h in handles:
            self.hooks.pop(getattr(h, "id", None), None)

    def set(self, on: bool) -> None:
        """Put every hook in (``on``) or take them out; nothing to do when already so."""
        if on != self.paused:
            return
        self.paused = not on
        for h, fn in self.hooks.values():
            d = h.hooks_dict_ref()
            if d is None:
                continue
            if on:
                d[h.id] = fn
            else:
                self._take_out(h)

    @staticmethod
    def _take_out(handle: Any) -> None:
        d = handle.hooks_dict_ref()
        if d is not None:
            d.pop(handle.id, None)
