"""``dbg.verify(replay, steps=20, top=3)``: test the leading hypotheses by replaying with the fix.

For the abnormal root states in order of probability (reported or not: a fault the
observation missed can still be found), until ``top`` of them were replayed, :func:`verify`

1. restores the snapshot its intervention starts from (the first one for initialization, else
   the last one at or before the hypothesis' onset), model, optimizer, RNG and tracked state;
2. asks the intervention whether it can act on this run at all (untestable: no steps spent);
3. applies it and replays ``[start, end)`` with the user's ``replay(model, optimizer, step)``
   under a fresh internal monitor with the original's settings (``dbg.settings``), where ``end`` covers ``steps``
   steps (and at least ``steps // 4`` past the onset), within the original run;
4. compares the replayed losses with the original ones and, in a window from the run's first
   step, the replay's events with the hypothesis' own (:mod:`.outcome`).

Afterwards the model, its gradients and train/eval flags, the optimizer, the scaler, tracked
objects and the RNG are put back exactly as they were, also when ``replay`` raises; the
posterior is updated with one interventional observation per tested hypothesis
(:mod:`.likelihoods`). ``docs/verification.md`` has the method and its limits.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch

from neuraldbg.causal import api as capi
from neuraldbg.causal import hypotheses as _hyp
from neuraldbg.causal.nodes.causes import retention_not_kept
from neuraldbg.causal.types import Posterior
from neuraldbg.verify import likelihoods as L
from neuraldbg.verify.interventions import Context, get_intervention
from neuraldbg.verify.outcome import compare, loss_map, symptoms_in
from neuraldbg.verify.snapshots import Snapshots, capture, of, restore
from neuraldbg.verify.types import Test, Verification, VerifiedHypothesis

log = logging.getLogger("neuraldbg")

DEFAULT_STEPS = 20
DEFAULT_TOP = 3

NO_SNAPSHOTS = ("verify needs snapshots of the run, and this monitor keeps none: create it with "
                "NeuralDbg(model, optimizer=optimizer, snapshots=True) (or snapshots=K for a ring of K) "
                "and train again")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _check(dbg: Any, replay: Any, steps: Any, top: Any) -> Snapshots:
    _positive("steps", steps)
    _positive("top", top)
    if not callable(replay):
        raise TypeError(f"replay must be callable as replay(model, optimizer, step) -> loss, "
                        f"got {type(replay).__name__}")
    snaps = of(dbg)
    if snaps is None:
        raise RuntimeError(NO_SNAPSHOTS)
    if dbg.optimizer is None:
        raise ValueError("verify needs the optimizer the replay steps: NeuralDbg(model, optimizer=optimizer, "
                         "snapshots=True)")
    if dbg.active:
        raise RuntimeError("verify replays training, so it runs after the `with NeuralDbg(...)` block, not inside it")
    if snaps.first is None:
        raise RuntimeError("no snapshot was taken: the monitor was never entered")
    return snaps


def _loss_value(loss: Any, step: int) -> tuple[Any, float]:
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.detach().reshape(()), float(loss.detach().float())
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss), float(loss)
    raise TypeError(f"replay(model, optimizer, {step}) must return the step's loss (a float or a 0-d tensor), "
                    f"got {type(loss).__name__}")


def _run_test(dbg: Any, snaps: Snapshots, replay: Callable, hyp: Any, trace: Any, steps: int,
              reference_lost: bool = False) -> Test:
    iv = get_intervention(hyp.cause, hyp.state)
    if iv is None:
        return Test(hyp.cause, hyp.state, "none", "untestable", reason="no intervention is registered for it")
    onset = hyp.onset_step if hyp.onset_step is not None else trace.first_step
    snap = snaps.first if iv.from_start else (snaps.before(onset) or snaps.first)
    start = snap.step
    onset = max(onset, start)
    # long runs space snapshots more than `steps` apart: reach past the onset all the same
    end = min(max(start + steps, onset + max(1, steps // 4)), trace.last_step + 1)
    base = dict(cause=hyp.cause, state=hyp.state, intervention=iv.describe())
    if end - start < 2:
        return Test(**base, outcome="untestable", reason=f"the run ends at step {trace.last_step}: no window to replay")
    restore(snap, dbg.root, dbg.optimizer, dbg.scaler, snaps.tracked)
    original = loss_map(trace.loss.history)
    ctx = Context(model=dbg.root, optimizer=dbg.optimizer, hypothesis=hyp, trace=trace,
                  references=snaps.references, input_reference=snaps.inputs.reference(),
                  original=original, window=(start, end, onset))
    why = iv.untestable(ctx)
    if why:
        return Test(**base, outcome="untestable", reason=why)
    replayed: dict[int, float] = {}
    undo = iv.apply(ctx)
    try:
        # the original's settings, without its own add-ons (no snapshots, no autosave)
        inner = type(dbg)(dbg.model, **dbg.settings.replace(snapshots=None, autosave=None, resume=None).as_kwargs())
        with inner:
            for t in range(start, end):
                inner.step = t
                loss, value = _loss_value(replay(dbg.model, dbg.optimizer, t), t)
                inner.record_loss(loss)
                replayed[t] = value
    finally:
        undo()
    # events pair up only when the replay's detectors saw the history the original's did
    paired = start <= trace.first_step
    # the original's checks over the window (every="auto" may have checked it at several intervals)
    latency = dbg.config.regime_persistence * max(1, dbg.cadence.max_interval(start, end))
    symptoms = symptoms_in(hyp.evidence, start, end, latency) if paired else []
    # a run that gave up part of its reference task: the reference is a symptom too
    refs = (loss_map(dbg.reference_points()), loss_map(inner.reference_points())) if reference_lost else None
    cmp = compare(original, replayed, start, end, onset, symptoms=symptoms, replay_events=inner.events,
                  reference=refs)
    return Test(**base, outcome=cmp.outcome, start_step=start, end_step=end, steps=end - start,
                improvement=cmp.improvement, nonfinite_before=cmp.nonfinite_before,
                nonfinite_after=cmp.nonfinite_after, events_after=len(inner.events), acted=ctx.acted,
                layers=tuple(ctx.notes.get("layers", ())), symptoms=cmp.symptoms,
                symptoms_after=cmp.symptoms_after, reference_gain=cmp.reference_gain)


def verify(dbg: Any, replay: Callable, steps: int = DEFAULT_STEPS, top: int = DEFAULT_TOP,
           likelihoods: Any = None) -> Verification:
    """Test the leading hypotheses of ``dbg`` with ``steps``-step replays until ``top`` of them
    were replayed (untestable ones cost nothing; module docstring).

    ``likelihoods``: a likelihood file path (default: the shipped ``verification.json``).
    Raises ``RuntimeError`` when the monitor keeps no snapshots (the message says how to turn
    them on) or is still active; exceptions of ``replay`` propagate after the state is restored.
    """
    snaps = _check(dbg, replay, steps, top)
    table = L.table_for(dbg.family, L.load(likelihoods))
    trace = dbg.trace()
    pri = capi.resolve_priors(trace, dbg.priors)
    net = capi.compiled(pri)
    ev = capi.evidence(trace)
    before = capi.posterior(trace, pri)
    joint = net.root_joint_posterior(ev.observed, before.ruled_out)
    built = {(h.cause, h.state): h for h in _hyp.hypotheses(trace, before, net, ev, floor=0.0)}
    lost = retention_not_kept(ev.observed.get("retention"))  # the reference is a symptom (outcome.py)
    end_state = capture(dbg.root, dbg.optimizer, dbg.scaler, trace.last_step + 1, snaps.tracked, full=True)
    tests: list[Test] = []
    try:
        for c, s, _ in before.abnormal():  # most probable first, until `top` were replayed
            tests.append(_run_test(dbg, snaps, replay, built[(c, s)], trace, steps, lost))
            if sum(t.outcome != "untestable" for t in tests) >= top:
                break
    finally:
        restore(end_state, dbg.root, dbg.optimizer, dbg.scaler, snaps.tracked)

    observed = [(t.label, t.outcome) for t in tests if t.outcome != "untestable"]
    after_joint = L.update(joint, observed, table)
    marg, p_ok = L.marginals(after_joint)
    after = Posterior(marg, p_ok, evidence={**ev.observed, **{f"verify:{lab}": o for lab, o in observed}},
                      source=before.source, ruled_out=before.ruled_out)
    by_label = {t.label: t for t in tests}
    hyps = []
    for c, s, p in after.abnormal():
        test = by_label.get(f"{c}/{s}")
        if p < _hyp.REPORT_FLOOR and test is None:
            continue
        h = _hyp.build(trace, after, net, ev, c, s)
        fields = {f.name: getattr(h, f.name) for f in dataclasses.fields(h)}
        if test is not None:
            fields["description"] = f"{h.description} {test.sentence()}"
        hyps.append(VerifiedHypothesis(**fields, verified=test.verified if test else None,
                                       probability_before=float(before[c][s]), test=test))
    hyps.sort(key=lambda h: -h.probability)
    extra = sum(t.steps for t in tests)
    log.info("neuraldbg: verification replayed %d steps; P(healthy) %.3f -> %.3f", extra, before.p_healthy,
             after.p_healthy)
    return Verification(hypotheses=tuple(hyps), posterior=after, extra_steps=extra, tests=tuple(tests),
                        posterior_before=before, root_joint_before=tuple(float(x) for x in joint))


def snapshot_bytes(dbg: Any) -> int:
    """Bytes the monitor's snapshots hold (0 when snapshots are off)."""
    snaps = of(dbg)
    return snaps.nbytes if snaps is not None else 0
