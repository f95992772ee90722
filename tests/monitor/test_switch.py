"""The hook switch: hooks leave torch's dicts on unchecked steps, rotating shares take turns,
and a transition touches only the hooks that change state."""
from functools import partial

import torch
from torch import nn

from neuraldbg.monitor.switch import EVERY_GROUP, HookSwitch


def hooked(n):
    """``n`` linear layers with a counting forward hook each, registered in switch groups 0/1."""
    calls = []
    mods = [nn.Linear(2, 2) for _ in range(n)]
    sw = HookSwitch()
    for i, m in enumerate(mods):
        fn = partial(lambda i, mod, a, out: calls.append(i), i)
        sw.add(m.register_forward_hook(fn), fn, group=i % 2)
    return mods, sw, calls


def call_all(mods, calls):
    calls.clear()
    for m in mods:
        m(torch.zeros(1, 2))
    return sorted(calls)


def test_hooks_are_in_on_registration_then_follow_the_switch():
    mods, sw, calls = hooked(4)
    assert call_all(mods, calls) == [0, 1, 2, 3]
    sw.set(False)
    assert sw.paused and call_all(mods, calls) == []
    assert all(not m._forward_hooks for m in mods)  # out of torch's dicts: the fast call path
    sw.set(True, 1)
    assert call_all(mods, calls) == [1, 3]
    sw.set(True, 0)
    assert call_all(mods, calls) == [0, 2]
    sw.set(True, EVERY_GROUP)
    assert call_all(mods, calls) == [0, 1, 2, 3]


def test_a_transition_touches_only_the_groups_that_change():
    mods, sw, calls = hooked(4)
    sw.set(True, 0)
    before = {id(m): dict(m._forward_hooks) for m in mods}
    sw.set(True, 0)  # nothing changes: the same dict objects, untouched
    assert {id(m): dict(m._forward_hooks) for m in mods} == before
    assert sw.live == frozenset((None, 0))


def test_a_removed_handle_stays_removed_and_is_forgotten():
    mods, sw, calls = hooked(2)
    handle = next(iter(sw.groups[0].values()))[0]
    sw.set(False)
    handle.remove()  # removing a paused hook is a no-op on the dict
    sw.forget([handle])
    sw.set(True, EVERY_GROUP)
    assert call_all(mods, calls) == [1]


def test_a_hook_added_while_paused_stays_out_until_its_group_is_in():
    mods, sw, calls = hooked(2)
    sw.set(True, 0)
    extra = nn.Linear(2, 2)
    fn = lambda mod, a, out: calls.append(9)  # noqa: E731
    sw.add(extra.register_forward_hook(fn), fn, group=1)
    assert call_all([*mods, extra], calls) == [0]
    sw.set(True, 1)
    assert call_all([*mods, extra], calls) == [1, 9]
