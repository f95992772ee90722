"""Collapsing and compression: properties (hypothesis) and hand cases."""
from hypothesis import given, settings
from hypothesis import strategies as st

from neuraldbg.events.base import ACTIVATION, DATA, GRADIENT, Event
from neuraldbg.events.compress import EventLog, collapse, compress

KINDS = [(GRADIENT, "vanishing"), (GRADIENT, "exploding"), (ACTIVATION, "dead"), (DATA, "nan")]

events_st = st.lists(
    st.builds(lambda tk, layer, step, sev: Event(type=tk[0], kind=tk[1], layer=layer, step=step, severity=sev),
              st.sampled_from(KINDS), st.sampled_from(["a", "b", "c"]), st.integers(0, 60),
              st.floats(0, 10, allow_nan=False)),
    max_size=40)


@settings(max_examples=200, deadline=None)
@given(events_st, st.integers(0, 5))
def test_collapse_is_idempotent_ordered_and_keeps_first_step(events, gap):
    once = collapse(events, gap)
    assert collapse(once, gap) == once
    assert [e.step for e in once] == sorted(e.step for e in once)
    assert sum(e.count for e in once) == len(events)
    for key in {e.key for e in events}:
        assert min(e.step for e in events if e.key == key) == min(e.step for e in once if e.key == key)


@settings(max_examples=200, deadline=None)
@given(events_st, st.integers(0, 5))
def test_online_log_equals_offline_collapse(events, gap):
    log = EventLog(gap)
    for e in sorted(events, key=lambda e: e.step):
        log.add(e)
    assert sorted(log.events, key=repr) == sorted(collapse(events, gap), key=repr)


def test_collapse_merges_runs_and_splits_gaps():
    evs = [Event(GRADIENT, "vanishing", "a", s, severity=s) for s in (1, 2, 3, 10)]
    out = collapse(evs, gap=1)
    assert [(e.step, e.end_step, e.count, e.severity) for e in out] == [(1, 3, 3, 3.0), (10, 10, 1, 10.0)]


def test_a_per_type_gap_merges_that_type_only():
    """Rotating shares read a layer's outputs every few checks: its activation regime repeats
    that far apart, while gradients, read on every check, keep the common gap."""
    log = EventLog(gap=1, gaps={ACTIVATION: 4})
    for s in (0, 4, 8):
        log.add(Event(ACTIVATION, "dead", "a", s))
        log.add(Event(GRADIENT, "vanishing", "a", s))
    got = sorted((e.type, e.step, e.count) for e in log.events)
    assert got == [(ACTIVATION, 0, 3), (GRADIENT, 0, 1), (GRADIENT, 4, 1), (GRADIENT, 8, 1)]


def test_compress_propagation_follows_layer_order_on_ties():
    evs = [Event(GRADIENT, "vanishing", "out", 5), Event(GRADIENT, "vanishing", "in", 5),
           Event(GRADIENT, "vanishing", "mid", 7), Event(DATA, "nan", "in", 9)]
    idx = {"in": 0, "mid": 1, "out": 2}.get
    props = compress(evs, idx)
    assert [(p.kind, p.first.layer) for p in props] == [("vanishing", "in"), ("nan", "in")]
    assert props[0].order == (("in", 5), ("out", 5), ("mid", 7))


def test_merge_is_the_validated_replace():
    import dataclasses

    from neuraldbg.events.compress import merge

    a = Event(type=GRADIENT, kind="vanishing", layer="a", step=3, severity=1.0, values={"x": 1.0})
    b = Event(type=GRADIENT, kind="vanishing", layer="a", step=5, severity=2.5)
    m = merge(a, b)
    want = dataclasses.replace(a, end_step=5, count=2, severity=2.5)
    assert m == want and hash(m) == hash(want) and type(m) is Event
    assert a.end_step == 3 and a.count == 1  # the original is untouched


@settings(max_examples=100, deadline=None)
@given(events_st, st.integers(0, 5), st.integers(1, 40))
def test_online_log_read_mid_run_keeps_what_it_returned(events, gap, cut):
    """A run merged into after ``events`` was read gets a new Event: the list returned earlier
    still holds the values it had (events are frozen records)."""
    log = EventLog(gap)
    ordered = sorted(events, key=lambda e: e.step)
    for e in ordered[:cut]:
        log.add(e)
    early = log.events
    snapshot = [repr(e) for e in early]
    for e in ordered[cut:]:
        log.add(e)
    assert [repr(e) for e in early] == snapshot
    assert sorted(log.events, key=repr) == sorted(collapse(events, gap), key=repr)
