"""The schedule over the whole run and the optimizer's state on entry
(neuraldbg/causal/nodes/schedule.py ``lr_schedule``, neuraldbg/causal/nodes/optimizer_state.py
``optimizer_restart``): the pure functions on hand-computed losses, then the extractors on
hand-made traces."""
from __future__ import annotations

import math

from neuraldbg.causal import api
from neuraldbg.causal.nodes.optimizer_state import RESUME_RISE, resume_rise
from neuraldbg.causal.nodes.schedule import (COLLAPSE_SPAN, UNCONVERGED, collapse_state, jump_answered,
                                             loss_reference)
from tiny import make_trace

CHANCE = math.log(4)


def hist(values, start=0):
    return [(start + i, v) for i, v in enumerate(values)]


def test_loss_reference_is_chance_else_the_runs_own_start():
    assert loss_reference(hist([9.0] * 30), CHANCE) == CHANCE
    # no chance level: the median of the first tenth (at least 3 losses)
    assert loss_reference(hist([2.0, 4.0, 3.0] + [1.0] * 27), None) == 3.0
    assert loss_reference(hist([1.0, 2.0]), None) is None
    assert loss_reference(hist([0.0] * 30), None) is None


def test_a_collapse_over_most_of_the_run_with_the_loss_far_from_its_floor():
    # 100 steps, the rate collapsed at step 30, the loss stuck at 0.8 of chance from there
    losses = hist([CHANCE * (1 - 0.2 * min(i, 30) / 30) for i in range(100)])
    ok, level = collapse_state(30, 0, 99, losses, CHANCE)
    assert ok and abs(level - 0.8) < 1e-9


def test_a_decay_to_zero_at_the_end_or_a_loss_at_its_floor_is_no_collapse():
    falling = hist([CHANCE * 0.99 ** i for i in range(100)])
    # cosine to zero: under the cut over its last 2 % only
    assert collapse_state(98, 0, 99, falling, CHANCE) == (False, None)
    span_start = 99 - math.ceil(COLLAPSE_SPAN * 99)  # just long enough
    assert collapse_state(span_start, 0, 99, hist([0.9 * CHANCE] * 100), CHANCE)[0]
    # a long collapse after the loss reached its floor (a tenth of chance): the run had converged
    ok, level = collapse_state(30, 0, 99, hist([CHANCE] * 30 + [0.1 * CHANCE] * 70), CHANCE)
    assert not ok and level < UNCONVERGED
    assert collapse_state(None, 0, 99, falling, CHANCE) == (False, None)


def test_a_jump_counts_when_the_loss_answers():
    calm = hist([0.05] * 20 + [0.06] * 20)
    assert jump_answered(19, calm, CHANCE) is None                     # SGDR: the loss stays at its level
    thrown = hist([0.05] * 20 + [0.5] * 20)
    assert jump_answered(19, thrown, CHANCE) == 10.0                   # 10x, to 0.36 of chance
    tiny = hist([1e-4] * 20 + [1e-2] * 20)
    assert jump_answered(19, tiny, CHANCE) is None                     # 100x, but still near zero
    assert jump_answered(19, tiny, None) == 100.0                      # no reference: the rise alone
    assert jump_answered(38, thrown, CHANCE) is None                   # too few losses after it


def test_resume_rise_reads_the_first_tenth_of_the_run():
    base = [6e-4] + [0.4] * 10 + [0.2] * 89
    rise, thrown, n = resume_rise(hist(base), 0, 99, CHANCE)
    assert abs(rise - 0.4 / 6e-4) < 1e-6 and (thrown, n) == (10, 10)   # steps 1..10 (at least 10 steps)
    assert resume_rise(hist([0.05] + [0.06] * 99), 0, 99, CHANCE) is None       # kept its level
    assert resume_rise(hist([2.0] + [1.0] * 99), 0, 99, CHANCE) is None         # a fine-tune falls
    late = [6e-4] * 50 + [0.4] * 50
    assert resume_rise(hist(late), 0, 99, CHANCE) is None                        # a rise later is not the resume
    assert resume_rise(hist(base, start=5), 0, 104, CHANCE) is None              # first step's loss unknown
    # thrown off its floor and back between bad steps: 4 of 10 steps thrown is a shock
    spiky = [0.004, 0.25, 0.001, 0.002, 0.36, 0.016, 0.5, 0.005, 0.25, 0.004, 0.006] + [0.004] * 89
    assert resume_rise(hist(spiky), 0, 99, CHANCE)[1:] == (4, 10)
    # one batch's confident mistake (1 of 10) is not; nor are rises that stay near zero
    one = [0.004, 0.005, 0.006, 0.2, 0.005, 0.004, 0.005, 0.006, 0.005, 0.004, 0.006] + [0.004] * 89
    assert resume_rise(hist(one), 0, 99, CHANCE) is None
    assert resume_rise(hist([1e-4] + [1e-2] * 99), 0, 99, CHANCE) is None
    assert RESUME_RISE == 5.0


def read(losses, **sigs):
    tr = make_trace(losses=losses, sigs={"out_features": 4, **sigs})
    ev = api.evidence(tr)
    return ev.observed.get("lr_schedule"), ev.observed.get("optimizer_restart"), ev


def test_lr_schedule_reads_collapse_jump_and_steady_with_their_onsets():
    lr = {"lr_first": 1e-2, "lr_peak": 1e-2, "lr_checked": 100, "lr_warmup_steps": 0, "lr_jump_steps": []}
    stuck = [CHANCE * (1 - 0.2 * min(i, 30) / 30) for i in range(100)]
    state, _, ev = read(stuck, lr_collapse_step=30, **lr)
    assert state == "collapsed" and ev.support["lr_schedule"][0].step == 30
    assert read(stuck, **lr)[0] == "steady"
    thrown = [0.05] * 50 + [0.6] * 50
    state, _, ev = read(thrown, **{**lr, "lr_jump_steps": [49], "lr_jump_factor": 300.0})
    assert state == "jumped" and ev.support["lr_schedule"][0].step == 49
    assert read([0.05] * 100, **{**lr, "lr_jump_steps": [49], "lr_jump_factor": 300.0})[0] == "steady"
    assert read(stuck)[0] is None                                        # no rate read


def test_optimizer_restart_only_on_trained_weights():
    resumed = [6e-4] + [0.4] * 10 + [0.2] * 89
    lr = {"lr_first": 1e-2, "lr_peak": 1e-2, "lr_checked": 100, "optimizer": "AdamW"}
    trained = {"started_trained": "the first loss is far below chance"}
    _, state, ev = read(resumed, optimizer_state_steps=0, **lr, **trained)
    assert state == "shock" and ev.support["optimizer_restart"][0].step == 0
    assert read(resumed, optimizer_state_steps=500, **lr, **trained)[1] == "none"      # state restored
    assert read(resumed, optimizer_state_steps=0, **{**lr, "lr_first": 1e-4}, **trained)[1] == "none"  # warm-up
    assert read([0.05] * 100, optimizer_state_steps=0, **lr, **trained)[1] == "none"   # no shock
    assert read(resumed, optimizer_state_steps=0, **lr)[1] is None                      # at initialization
    assert read(resumed, optimizer_state_steps=0, **{**lr, "optimizer": "SGD"}, **trained)[1] is None


def test_a_collapse_leaves_the_readings_of_one_rate_unobserved():
    """A collapsed run is two regimes: the whole-run readings that assume one rate (progress, a
    calm loss pattern, a step size measured before the collapse) would say 'learning at a normal
    rate' of the part before it and outvote the collapse; they are left to lr_schedule. A steady
    schedule keeps them."""
    lr = {"lr_first": 1e-2, "lr_peak": 1e-2, "lr_checked": 100, "lr_warmup_steps": 0, "lr_jump_steps": [],
          "step_ratio_median": 3e-3, "step_ratio_max": 4e-3, "step_ratio_steps": 16}
    stuck = [CHANCE * (1 - 0.2 * min(i, 30) / 30) for i in range(100)]
    tr = make_trace(losses=stuck, sigs={"out_features": 4, "lr_collapse_step": 30, **lr},
                    sig_steps={"step_ratio_median": 16})
    ev = api.evidence(tr)
    assert ev.observed["lr_schedule"] == "collapsed"
    for var in ("progress", "loss_pattern", "step_size"):
        assert var not in ev.observed and "collapsed at step 30" in ev.unobserved[var]
    steady = api.evidence(make_trace(losses=stuck, sigs={"out_features": 4, **lr}, sig_steps={"step_ratio_median": 16}))
    assert {"progress", "loss_pattern", "step_size"} <= set(steady.observed)
    # a step size measured after the collapse reads the collapsed rate: kept
    late = make_trace(losses=stuck, sigs={"out_features": 4, "lr_collapse_step": 30, **lr},
                      sig_steps={"step_ratio_median": 60})
    assert "step_size" in api.evidence(late).observed
