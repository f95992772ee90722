"""Merging the per-rank traces of a distributed run into one session.

Each rank of a ``DistributedDataParallel`` job runs its own ``NeuralDbg`` and exports its own
session (events carry the rank). :func:`merge_sessions` joins them: an event that every
rank saw at (nearly) the same step is one shared event (``rank`` None); anything else
stays rank-local with its rank, so "NaN input on rank 1 at step 40" survives as such. Each
signature is merged over the ranks that measured it by the rule its declaration names
(:func:`merge_signatures`). The live merge of a job's traces at exit, on rank 0, runs this
merge too (``neuraldbg/monitor/livemerge.py``).
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Iterable

from neuraldbg.events.base import DATA, Event
from neuraldbg.trace import Signatures, Trace, merge_values

log = logging.getLogger("neuraldbg")


def _as_trace(item: Any) -> tuple[Trace, dict]:
    """A trace (and its document, if any) from a path, Session, NeuralDbg or Trace."""
    from neuraldbg.session import Session, load_session

    if isinstance(item, Trace):
        return item, {}
    if isinstance(item, (str, Path)):
        item = load_session(item)
    if isinstance(item, Session):
        return item.trace(), item.doc
    if hasattr(item, "trace") and callable(item.trace):  # a live NeuralDbg
        doc = {"config": item.config.to_dict()} if hasattr(item, "config") else {}
        return item.trace(), doc
    raise TypeError(f"merge_sessions expects session paths, Sessions, NeuralDbg monitors or Traces, "
                    f"got {type(item).__name__}")


def _origin(ev: Event) -> tuple:
    # where a data anomaly entered is part of its identity: NaN input on one rank and the
    # NaN weights it spreads to the others through the gradient all-reduce are different
    # findings even when they land on the same layer a step apart
    return (ev.measured.get("at_input"),) if ev.type == DATA else ()


def merge_events(per_rank: dict[int, list[Event]], tolerance: int = 2) -> list[Event]:
    """Merge per-rank event lists (``rank -> events``).

    An episode is *shared* when every rank has one of the same (type, kind, layer) and origin
    starting within ``tolerance`` steps of each other; it becomes one event with ``rank``
    None, the earliest start, the latest end, the largest count and severity, and the
    earliest rank's measured values. Every other episode is kept with its rank.
    """
    ranks = sorted(per_rank)
    if len(ranks) < 2:
        return [dataclasses.replace(e, rank=r) for r in ranks for e in per_rank[r]]
    pools: dict[tuple, dict[int, list[Event]]] = {}
    for r in ranks:
        for e in per_rank[r]:
            pools.setdefault((*e.key, *_origin(e)), {}).setdefault(r, []).append(dataclasses.replace(e, rank=r))
    out: list[Event] = []
    for by_rank in pools.values():
        for r in by_rank:
            by_rank[r].sort(key=lambda e: e.step)
        base = ranks[0]
        while by_rank.get(base):
            ev = by_rank[base].pop(0)
            match = {base: ev}
            for r in ranks[1:]:
                cands = [e for e in by_rank.get(r, []) if abs(e.step - ev.step) <= tolerance]
                if not cands:
                    break
                match[r] = min(cands, key=lambda e: abs(e.step - ev.step))
            if len(match) < len(ranks):
                out.append(ev)  # rank-local
                continue
            for r, e in match.items():
                if r != base:
                    by_rank[r].remove(e)
            first = min(match.values(), key=lambda e: (e.step, e.rank))
            out.append(dataclasses.replace(
                first, rank=None, step=min(e.step for e in match.values()),
                end_step=max(e.end_step for e in match.values()), count=max(e.count for e in match.values()),
                severity=max(e.severity for e in match.values())))
        for r in ranks[1:]:
            out.extend(by_rank.get(r, []))  # episodes no other rank shared
    return sorted(out, key=lambda e: (e.step, e.end_step, e.type, e.kind, e.layer or "",
                                      -1 if e.rank is None else e.rank))


def merge_signatures(per_rank: list[Signatures]) -> Signatures:
    """The ranks' signatures (lowest rank first) merged, each by its declared rule (the lowest
    rank's value, the min, max, median or sum over the ranks that measured it, or whether any
    did); its step is the latest rank's (the merged value is known once every rank knew it). A
    signature no rank measured keeps the lowest rank's reason (with the ranks that gave one)."""
    from neuraldbg.causal.nodes import signature_table

    table = signature_table()
    names = sorted({n for s in per_rank for n in s.names()})
    values, steps = {}, {}
    for name in names:
        sig = table[name]
        have = [s for s in per_rank if sig in s]
        values[name] = merge_values(sig, [s.value(sig) for s in have])
        at = [s.step(sig) for s in have]
        steps[name] = max(at) if all(a is not None for a in at) else None
    gaps: dict[str, str] = {}
    for s in per_rank:
        for name, why in s.gaps().items():
            if name not in values and name not in gaps:
                n = sum(name in t.gaps() for t in per_rank)
                gaps[name] = why if n == len(per_rank) else f"{why} (on {n} of {len(per_rank)} ranks)"
    return Signatures(values, steps, gaps)


def merge_traces(traces: list[Trace], tolerance: int = 2) -> Trace:
    """One trace for a distributed run from one trace per rank (see :func:`merge_events`)."""
    if not traces:
        raise ValueError("merge_sessions needs at least one session")
    families = {t.family for t in traces}
    if len(families) > 1:
        raise ValueError(f"cannot merge sessions of different families {sorted(families)}; "
                         "pass the per-rank exports of one run")
    ranks = [t.rank if t.rank is not None else i for i, t in enumerate(traces)]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"duplicate ranks {ranks}: pass each rank's export once")
    world = {t.world_size for t in traces if t.world_size is not None}
    world_size = max(world) if world else len(traces)
    if len(traces) < world_size:
        missing = sorted(set(range(world_size)) - set(ranks))
        log.warning(
            "neuraldbg: merging %d of %d ranks (missing %s): events seen on every given rank "
            "count as shared", len(traces), world_size, missing)
    order = sorted(range(len(traces)), key=lambda i: ranks[i])
    traces = [traces[i] for i in order]
    ranks = [ranks[i] for i in order]
    events = merge_events({r: list(t.events) for r, t in zip(ranks, traces)}, tolerance)
    lead = traces[0]
    nonfinite_steps = [t.loss.first_nonfinite_step for t in traces if t.loss.first_nonfinite_step is not None]
    # the lowest rank's loss curve stands for the run (every rank trains the same model);
    # non-finite losses are counted on whichever rank saw most
    loss = dataclasses.replace(lead.loss, n_nonfinite=max(t.loss.n_nonfinite for t in traces),
                               first_nonfinite_step=min(nonfinite_steps) if nonfinite_steps else None)
    from neuraldbg.causal.nodes.run import MERGED_RANKS

    sigs = merge_signatures([t.signatures for t in traces]).updated({MERGED_RANKS: tuple(ranks)})
    return Trace(events=tuple(events), layers=lead.layers, family=lead.family,
                 first_step=min(t.first_step for t in traces), last_step=max(t.last_step for t in traces),
                 loss=loss, rank=None, world_size=world_size, signatures=sigs,
                 internal_errors=sum(t.internal_errors for t in traces),
                 # each rank chose its own (every="auto" times its own steps): the lowest rank's stands
                 cadence=lead.cadence)


def merge_sessions(sessions: Iterable[Any], tolerance: int = 2):
    """Merge per-rank sessions (paths, ``Session`` objects, live monitors or traces) into one
    :class:`~neuraldbg.session.Session` that answers the same queries.

    Events that all ranks saw within ``tolerance`` steps are deduplicated (``rank`` None);
    rank-local events keep their rank. The result's ``rank`` is None and ``world_size`` the
    job's; its ``merged_ranks`` signature lists the ranks merged.
    """
    from neuraldbg.session import Session

    pairs = [_as_trace(s) for s in sessions]
    trace = merge_traces([t for t, _ in pairs], tolerance)
    doc = dict(pairs[0][1]) if pairs and pairs[0][1] else {}
    return Session(trace, doc, None)


# ---- two consecutive parts of one run ------------------------------------------------------

#: loss points a concatenated trace keeps (a chain of resumes stays bounded, as one monitor's is)
CONCAT_HISTORY = 1024


def _concat_loss(a: Any, b: Any) -> Any:
    """The loss summary of ``a`` followed by ``b`` (``LossSummary`` s of consecutive parts)."""
    mins = [m for m in (a.min, b.min) if m is not None]
    history = tuple(a.history) + tuple(b.history)
    while len(history) > CONCAT_HISTORY:
        history = history[::2]
    return dataclasses.replace(
        b, n=a.n + b.n, first=a.first if a.n else b.first, last=b.last if b.n else a.last,
        min=min(mins) if mins else None, n_nonfinite=a.n_nonfinite + b.n_nonfinite,
        first_nonfinite_step=a.first_nonfinite_step if a.first_nonfinite_step is not None else b.first_nonfinite_step,
        history=history)


def concat_signatures(earlier: Signatures, later: Signatures) -> Signatures:
    """The signatures of a run made of ``earlier`` and then ``later`` (one rank, consecutive steps).

    Unlike the ranks of :func:`merge_signatures`, the parts saw different steps, so each
    signature combines by *when* it is measured (``neuraldbg/trace.py``):

    - ``entry``: the earlier part's, values and reasons alike: the run's entry is its entry.
      A part resumed from a checkpoint says ``started_trained``; the whole run did not, when
      its first part started at initialization;
    - ``window`` (the first checked steps): the earlier part's where it measured one, else the
      later's; but the step-size window is read at the peak learning rate, so when the later
      part ran at a higher ``lr_peak`` its step ratios are the run's;
    - ``run``: integers are counts over the steps and add up; ``max``/``min``/``any`` merge as
      over ranks; the others (``lr``, ``reference_tail``...) say the run's latest state: the
      later part's.

    A signature neither part measured keeps the earlier part's reason for an ``entry`` one, else
    the later part's (the earlier's when the later gives none).
    """
    from neuraldbg.causal.nodes import signature_table
    from neuraldbg.causal.nodes.run import LR_PEAK
    from neuraldbg.causal.nodes.causes import STEP_RATIO_MAX, STEP_RATIO_MEDIAN, STEP_RATIO_PEAK, STEP_RATIO_STEPS

    table = signature_table()
    step_size = {STEP_RATIO_MEDIAN.name, STEP_RATIO_MAX.name, STEP_RATIO_PEAK.name, STEP_RATIO_STEPS.name}
    peak_a, peak_b = earlier.number(LR_PEAK), later.number(LR_PEAK)
    later_peak = peak_b is not None and (peak_a is None or peak_b > peak_a) \
        and any(later.value(table[n]) is not None for n in step_size)
    values: dict[str, Any] = {}
    steps: dict[str, int | None] = {}
    e_steps, l_steps = earlier.steps(), later.steps()

    def take(name: str, src: Signatures, at: dict[str, int]) -> None:
        values[name], steps[name] = src.value(table[name]), at.get(name)

    for name in sorted(set(earlier.names()) | set(later.names())):
        sig = table[name]
        in_a, in_b = sig in earlier, sig in later
        if sig.when == "entry":
            if in_a:
                take(name, earlier, e_steps)
        elif sig.when == "window":
            if name in step_size and later_peak:
                if in_b:
                    take(name, later, l_steps)
            elif in_a:
                take(name, earlier, e_steps)
            else:
                take(name, later, l_steps)
        elif not (in_a and in_b):
            take(name, earlier if in_a else later, e_steps if in_a else l_steps)
        else:
            a, b = earlier.value(sig), later.value(sig)
            if sig.kind == "integer":
                values[name] = a + b
            elif sig.merge in ("max", "min", "any"):
                values[name] = merge_values(sig, [a, b])
            else:
                values[name] = b
            steps[name] = l_steps.get(name)
    gaps: dict[str, str] = {}
    for name in set(earlier.gaps()) | set(later.gaps()):
        if name in values:
            continue
        first, second = (earlier, later) if table[name].when == "entry" else (later, earlier)
        why = first.gaps().get(name)
        if why is None and table[name].when != "entry":
            why = second.gaps().get(name)
        if why is not None:
            gaps[name] = why
    return Signatures(values, steps, gaps)


def concat_traces(earlier: Trace, later: Trace) -> Trace:
    """One trace of a run from two consecutive parts of it on one rank: ``earlier`` up to a
    checkpoint, ``later`` resumed from it (``NeuralDbg(resume=...)``, the framework callbacks).

    Not a rank merge (:func:`merge_traces`: the same steps seen by several processes): the
    events of both parts are kept, in step order; the loss summaries join (counts add, the first
    loss is the earlier part's, the last the later's); the signatures combine by when they are
    measured (:func:`concat_signatures`). The layers and the rank are the later part's.
    ``ValueError`` when the parts are of different families or ``later`` starts before
    ``earlier``'s last step (not consecutive: resume from the checkpoint whose state is passed).
    """
    for name, t in (("earlier", earlier), ("later", later)):
        if not isinstance(t, Trace):
            raise TypeError(f"concat_traces: {name} must be a Trace, got {type(t).__name__}")
    if earlier.family != later.family:
        raise ValueError(f"concat_traces: the parts are of different families ({earlier.family!r}, "
                         f"{later.family!r}); pass two parts of one run")
    if later.first_step < earlier.last_step:
        raise ValueError(f"concat_traces: the later part starts at step {later.first_step}, before the earlier part's "
                         f"last step {earlier.last_step}: not consecutive parts of one run (resume from the "
                         "checkpoint whose state is passed)")
    events = sorted((*earlier.events, *later.events),
                    key=lambda e: (e.step, e.end_step, e.type, e.kind, e.layer or "", -1 if e.rank is None else e.rank))
    return Trace(events=tuple(events), layers=later.layers or earlier.layers, family=later.family,
                 first_step=earlier.first_step, last_step=max(earlier.last_step, later.last_step),
                 loss=_concat_loss(earlier.loss, later.loss), rank=later.rank,
                 world_size=later.world_size if later.world_size is not None else earlier.world_size,
                 signatures=concat_signatures(earlier.signatures, later.signatures),
                 internal_errors=earlier.internal_errors + later.internal_errors,
                 cadence=concat_cadences(earlier.cadence, later.cadence))


def concat_cadences(earlier: Any, later: Any) -> Any:
    """The cadence of a run from those of two consecutive parts (:func:`concat_traces`): the
    earlier part's changes and anomalies, then the later part's; the setting and budget are the
    later part's. Either may be ``None`` (a part whose trace does not say)."""
    if earlier is None or later is None:
        return later if earlier is None else earlier
    return dataclasses.replace(later, changes=earlier.changes + later.changes, alarms=earlier.alarms + later.alarms,
                               changes_omitted=earlier.changes_omitted + later.changes_omitted,
                               alarms_omitted=earlier.alarms_omitted + later.alarms_omitted)
