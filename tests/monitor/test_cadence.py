"""The monitor's cadence (neuraldbg/monitor/cadence.py): the interval chosen from the timings and
the budget, the dense start, dense again after an anomaly, the record in the session, and a
training that stays bit for bit the same at every cadence. Timings are injected: no test reads
the machine's clock."""
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.events.base import DATA, OPTIMIZER, make_event
from neuraldbg.monitor import cadence as C
from neuraldbg.monitor.cadence import AutoSchedule, FixedSchedule, interval_for, with_hysteresis
from neuraldbg.report.cadence import describe, ordinal
from neuraldbg.trace import CadenceRecord
from tests.tiny import batches, run


# ---- the pure functions ------------------------------------------------------------------------

@pytest.mark.parametrize("t_checked, t_unchecked, overhead, want", [
    (4.0, 2.0, 0.25, 4),      # extra 2 over 0.25 * 2: exactly 4 (no step added by rounding)
    (3.0, 2.0, 0.03, 17),     # 1 / 0.06 = 16.7
    (1.3, 1.0, 0.03, 10),     # 0.3 / 0.03 = 10 in float rounding too
    (1.3, 1.0, 0.1, 3),
    (1.01, 1.0, 0.03, 1),     # a check that costs a third of the budget: every step
    (1.0, 1.0, 0.03, 1),      # a check that costs nothing
    (0.9, 1.0, 0.03, 1),      # faster than an unchecked step (noise)
])
def test_the_interval_holds_the_budget(t_checked, t_unchecked, overhead, want):
    n = interval_for(t_checked, t_unchecked, overhead)
    assert n == want
    assert (t_checked - t_unchecked) / (n * t_unchecked) <= overhead + 1e-12  # within the budget
    if n > 1:  # and the smallest such interval
        assert (t_checked - t_unchecked) / ((n - 1) * t_unchecked) > overhead


def test_the_interval_is_clamped():
    assert interval_for(100.0, 1.0, 0.03) == C.MAX_INTERVAL == 1000  # 3300 before the clamp
    assert interval_for(100.0, 1.0, 0.03, most=50) == 50
    assert interval_for(2.0, 0.0, 0.03) == C.MAX_INTERVAL  # an unchecked step of no measurable time
    assert interval_for(math.nan, 1.0, 0.03) == 1


@pytest.mark.parametrize("current, proposed, want", [
    (7, 8, 7), (7, 6, 7),     # within the band of 25 %: stays
    (7, 9, 9), (7, 5, 5),     # outside it: moves
    (1, 2, 2), (4, 5, 4), (4, 6, 6), (40, 33, 40), (40, 31, 31),
])
def test_hysteresis_keeps_the_interval_within_its_band(current, proposed, want):
    assert with_hysteresis(current, proposed) == want


def test_the_timing_mean_counts_what_is_far_above_the_median_as_the_median():
    assert C.CLIP == 4.0
    assert C.robust_mean([1.0, 1.0, 1.0, 100.0]) == 1.0  # a gap between steps, not the check
    assert C.robust_mean([1.0, 1.0, 1.0, 4.0]) == 7 / 4   # at 4x the median it still counts
    assert C.robust_mean([1.0, 2.0, 3.0]) == 2.0
    assert math.isnan(C.robust_mean([]))


def test_the_spike_threshold_is_three_times_the_recent_median():
    assert C.spike_threshold([1.0, 2.0, 3.0, 4.0]) == math.inf  # too few losses to tell
    assert C.spike_threshold([5.0, 1.0, 2.0, 4.0, 3.0]) == 9.0
    assert C.spike_threshold([-1.0, -2.0, -3.0, -4.0, -5.0]) == math.inf  # no positive scale


def test_a_spike_also_rises_half_the_start_level_as_the_detector_s_do():
    from neuraldbg.config import DetectorConfig

    assert C.SPIKE_MIN_JUMP == DetectorConfig().spike_min_jump == 0.5
    floor = [0.01, 0.012, 0.009, 0.011, 0.01]
    # a loss started at 1.39 and fitted to 0.01: 3x is 0.03, a batch's blip; the jump must be 0.695
    assert C.spike_threshold(floor, start=1.39) == pytest.approx(0.01 + 0.695)
    # near its start level, three times the median is the larger
    assert C.spike_threshold([1.2, 1.3, 1.4, 1.3, 1.3], start=1.39) == pytest.approx(3.9)
    assert C.spike_threshold(floor) == pytest.approx(0.03)  # start not known yet: the ratio alone


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th", "112th"]


def test_the_cadence_is_said_in_one_line():
    rec = CadenceRecord("auto", 0.03, ((0, 1), (33, 4), (65, 7), (213, 1), (229, 7)), ((212, 213, "loss spike"),))
    assert describe(rec) == ("Checked every step for the first 33 steps, then every 7th step (budget 3 %); dense "
                             "again after the loss spike at step 212.")
    # a session written when the probe checked every 2nd step says the same
    rec = CadenceRecord("auto", 0.05, ((0, 1), (33, 2), (51, 12), (300, 22)),
                        ((212, 213, "loss spike"), (400, 401, "non-finite loss")))
    assert describe(rec) == ("Checked every step for the first 33 steps, then every 22nd step (from every 12th step "
                             "to every 22nd step over the run; budget 5 %); dense again after the loss spike at "
                             "step 212 and after 1 more anomaly.")
    assert describe(CadenceRecord(10, None, ((0, 10),))) == "Checked every 10th step."
    assert describe(CadenceRecord(1, None, ((0, 1),))) == "Checked every step."
    assert describe(CadenceRecord("auto", 0.03, ((0, 1),))) == "Checked every step (budget 3 %)."
    assert describe(None) == ""


def test_the_record_answers_the_interval_at_a_step():
    rec = CadenceRecord("auto", 0.03, ((0, 1), (33, 2), (51, 7), (213, 1), (229, 7)))
    assert [rec.interval_at(s) for s in (0, 32, 33, 50, 51, 212, 213, 228, 229, 10_000)] == [1, 1, 2, 2, 7, 7, 1, 1,
                                                                                          7, 7]
    assert rec.max_interval(0, 20) == 1 and rec.max_interval(200, 220) == 7 and rec.max_interval(215, 225) == 1
    assert CadenceRecord(10, None, ((0, 10),)).max_interval(3, 8) == 10
    assert [rec.next_checked(s) for s in (0, 32, 33, 34, 52, 69, 70, 200, 212, 213, 228, 229, 230)] == [
        0, 32, 34, 34, 56, 70, 70, 203, 213, 213, 228, 231, 231]
    assert CadenceRecord(10, None, ((0, 10),)).next_checked(31) == 40


# ---- the schedules, driven as the monitor drives them --------------------------------------------

def drive(sched, steps, duration, start=1, now=None):
    """Run ``sched`` over steps ``start..steps-1`` as ``record_loss`` does: a step is started on the
    schedule (and timed) when it or the step before it is checked, else on the fast path.
    ``duration(step, checked)`` is the step's time on the injected clock ``now`` (a one-item list,
    to go on with a later call). Returns the checked steps (step 0, the monitor's first buffer,
    when ``start`` is 1)."""
    now = [0.0] if now is None else now
    sched.clock = lambda: now[0]
    checked = [0] if start == 1 else []
    prev = start - 1 == getattr(sched, "last_checked", 0)
    for step in range(start, steps):
        is_checked = sched.start(step) if prev or step >= sched.next_start else False
        if is_checked:
            checked.append(step)
        now[0] += duration(step, is_checked)
        prev = is_checked
    return checked


def costs(t_checked, t_unchecked):
    return lambda step, checked: t_checked if checked else t_unchecked


def test_the_first_steps_are_checked_one_by_one():
    checked = drive(AutoSchedule(), 40, costs(2.0, 1.0))
    # step 0 (the monitor's first buffer), then the 32 steps from the first one the loop started
    assert checked[:33] == list(range(33)) and 33 not in checked
    assert C.DENSE_START == 32
    sched = AutoSchedule()
    checked = drive(sched, 5040, costs(2.0, 1.0), start=5000)  # a loop that numbers its own steps
    assert checked[:32] == list(range(5000, 5032)) and 5033 not in checked  # then the probe, every 4th
    assert sched.record().changes[0] == (5000, 1)


def test_a_costly_check_is_spread_to_hold_the_budget():
    sched = AutoSchedule(0.03)
    checked = drive(sched, 400, costs(2.0, 1.0))  # a check doubles the step: 1.25 / 0.03 -> every 42nd
    assert sched.interval == 42
    # the dense start, the probe (every 4th: a check, its tail and unchecked steps to time), then the estimate
    assert sched.record().changes == ((0, 1), (33, 4), (69, 42))
    later = [s for s in checked if s > 68]
    assert later and all(s % 42 == 0 for s in later)
    assert sched.record().budget == 0.03 and sched.record().every == "auto"


def test_check_cost_counts_the_check_and_its_tail():
    # a check adding 0.6 to its step and 0.4 to the next (its update) costs 1.0 over an unchecked 1.0
    assert C.check_cost((1.6 + 1.4) / 2, 2, 1.0) == pytest.approx(1.0)
    assert C.check_cost(2.0, 1, 1.0) == pytest.approx(1.0)  # back-to-back checks: one per span
    assert C.check_cost(1.0, 2, 1.0) == 0.0


def test_a_check_whose_update_runs_in_the_next_step_is_timed_whole():
    """A loop that records the loss before ``optimizer.step()`` runs the checked update in the next
    step's span. Split 0.5 / 0.5, the check costs as much as one doubling its own step: every 42nd."""
    sched = AutoSchedule(0.03)

    def cost(step, checked):
        return 1.5 if checked else (1.5 if step - 1 == sched.last_checked else 1.0)

    checked = drive(sched, 400, cost)
    assert sched.interval == 42
    later = [s for s in checked if s > 68]
    assert later and all(s % 42 == 0 for s in later)


def test_a_cheap_check_gets_every_step():
    sched = AutoSchedule(0.03)
    checked = drive(sched, 200, costs(1.02, 1.0))  # a check adds 2 %: within the 3 % budget
    assert sched.interval == 1
    assert checked[-100:] == list(range(100, 200))  # every step, from the first estimate on
    assert sched.record().changes == ((0, 1), (33, 4), (69, 1))


def test_the_interval_moves_only_outside_its_band():
    sched = AutoSchedule(0.03)
    phase, now = {"t": 2.0}, [0.0]
    cost = lambda s, c: phase["t"] if c else 1.0  # noqa: E731
    drive(sched, 400, cost, now=now)
    assert sched.interval == 42
    phase["t"] = 2.1  # 46 now: within 25 % of 42, the interval stays
    drive(sched, 3000, cost, start=400, now=now)
    assert sched.interval == 42
    phase["t"] = 3.0  # every 84th: outside the band
    drive(sched, 12000, cost, start=3000, now=now)
    # it moved as the timings in its window left the band, up to where 84 is within it
    assert with_hysteresis(sched.interval, 84) == sched.interval
    moves = [n for _, n in sched.record().changes]
    assert moves[:3] == [1, 4, 42] and 1 <= len(moves[3:]) <= 2 and moves[3:] == sorted(moves[3:])
    assert moves[3] > 42 * 1.25
    drive(sched, 40000, cost, start=12000, now=now)  # steady: no more moves
    assert [n for _, n in sched.record().changes] == moves


def test_a_larger_budget_checks_more_often():
    sched = AutoSchedule(0.5)
    drive(sched, 200, costs(2.0, 1.0))
    assert sched.interval == 3  # 1.25 / 0.5, aimed below the budget by the band


def test_a_fixed_interval_checks_the_multiples_as_always():
    sched = FixedSchedule(10)
    checked = drive(sched, 100, costs(5.0, 1.0))
    assert checked == list(range(0, 100, 10))
    assert [not sched.near_check(s) for s in (10, 11, 12, 19)] == [False, False, True, True]
    assert [sched.near_check(s) for s in (10, 11, 12)] == [True, True, False]
    assert sched.record() == CadenceRecord(10, None, ((0, 10),))
    assert not sched.alarm(50, 50, "loss spike")


def test_an_alarm_makes_the_cadence_dense_again():
    sched, now = AutoSchedule(0.03), [0.0]
    drive(sched, 313, costs(2.0, 1.0), now=now)
    assert sched.interval == 42
    assert sched.alarm(310, 312, "loss spike")  # the anomaly at step 310, noticed at step 312
    assert sched.next_check == 313
    assert not sched.alarm(305, 312, "loss spike")  # an earlier step than the one acted on
    checked = drive(sched, 400, costs(2.0, 1.0), start=313, now=now)
    assert checked[:16] == list(range(313, 313 + C.DENSE_AFTER_ANOMALY))
    assert 329 not in checked and checked[16] == 336  # then every 42nd again, on the multiples
    rec = sched.record()
    assert rec.alarms == ((310, 313, "loss spike"),)
    assert rec.changes[-2:] == ((313, 1), (329, 42))
    assert describe(rec).endswith("dense again after the loss spike at step 310.")


def test_losses_are_judged_at_their_onset():
    sched, now = AutoSchedule(), [0.0]
    drive(sched, 311, costs(2.0, 1.0), now=now)
    for step in range(100, 110):
        sched.watch_loss(step, 1.0, 300)
    assert sched.spike_above == 3.0
    sched.watch_loss(110, 2.9, 300)
    assert sched.dense_until == 33  # no anomaly: the start window only
    sched.watch_loss(310, 3.5, 310)  # a spike
    assert sched.dense_until == 311 + C.DENSE_AFTER_ANOMALY
    sched.watch_loss(311, math.nan, 311)  # the run of anomalies goes on: no new window
    assert sched.dense_until == 311 + C.DENSE_AFTER_ANOMALY
    sched.watch_loss(312, 1.0, 312)
    drive(sched, 341, costs(2.0, 1.0), start=311, now=now)  # the dense window passes
    sched.watch_loss(340, math.inf, 340)  # after a normal loss: a new onset
    assert sched.dense_until == 341 + C.DENSE_AFTER_ANOMALY
    assert [why for _, _, why in sched.record().alarms] == [C.LOSS_SPIKE, C.NONFINITE_LOSS]


def test_the_records_are_bounded():
    rec = C._Record(0, 1)
    for i in range(1, C.MAX_CHANGES + 50):
        rec.change(i * 10, 1 + i % 2)
    last = C.MAX_CHANGES + 49
    assert len(rec.changes) == C.MAX_CHANGES and rec.changes_omitted == last + 1 - C.MAX_CHANGES
    assert rec.changes[:2] == [(0, 1), (10, 2)] and rec.changes[-1] == (last * 10, 1 + last % 2)
    for i in range(C.MAX_ALARMS + 3):
        rec.alarm(i, i + 1, "loss spike")
    assert len(rec.alarms) == C.MAX_ALARMS and rec.alarms_omitted == 3


# ---- the monitor --------------------------------------------------------------------------------

class Clock:
    """The schedule's clock in a monitored loop: a step lasts ``checked`` or ``unchecked`` seconds
    (the step that just ended was checked when it is the schedule's last checked step; the steps
    the fast path started since were not)."""

    def __init__(self, checked, unchecked):
        self.t, self.checked, self.unchecked, self.dbg = 0.0, checked, unchecked, None

    def __call__(self):
        if self.dbg is not None:
            sched, step = self.dbg._cadence, self.dbg.step
            prev = sched.current
            if step > prev:
                first = self.checked if prev == sched.last_checked else self.unchecked
                self.t += first + (step - prev - 1) * self.unchecked
        return self.t


def watched(monkeypatch, checked=2.0, unchecked=1.0, **kwargs):
    """A monitor whose schedule reads the injected clock."""
    clock = Clock(checked, unchecked)
    monkeypatch.setattr(C, "perf_counter", clock)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    dbg = NeuralDbg(model, **kwargs)
    clock.dbg = dbg
    return model, dbg


def train(model, dbg, steps, loss_at=None, seed=0):
    """A ``record_loss`` loop; ``loss_at(step, loss)`` may replace the loss recorded."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with dbg:
        for step, (x, y) in enumerate(batches(steps, seed=seed)):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            dbg.record_loss(loss if loss_at is None else loss_at(step, loss))
            opt.step()
    return dbg


def test_auto_is_the_default_and_its_budget_3_percent():
    dbg = NeuralDbg(nn.Linear(2, 2))
    assert dbg.every == "auto" and dbg.settings.every == "auto" and dbg.overhead == 0.03
    assert NeuralDbg(nn.Linear(2, 2), every=5, overhead=0.1).settings.overhead == 0.1  # kept, used by auto only


@pytest.mark.parametrize("every", [0, -1, 1.5, "fast", "AUTO", True, None])
def test_an_invalid_every_names_what_is_valid(every):
    with pytest.raises(ValueError, match=r"every must be an int >= 1 .* or 'auto'"):
        NeuralDbg(nn.Linear(2, 2), every=every)


@pytest.mark.parametrize("overhead", [0, 1, 1.5, -0.1, math.nan, math.inf, "3%", True, None])
def test_an_invalid_overhead_names_what_is_valid(overhead):
    with pytest.raises(ValueError, match=r"overhead must be a number in \(0, 1\)"):
        NeuralDbg(nn.Linear(2, 2), overhead=overhead)
    with pytest.raises(ValueError, match="overhead"):
        NeuralDbg(nn.Linear(2, 2), every=3, overhead=overhead)


def test_a_monitored_run_with_a_costly_check_spreads_its_checks(monkeypatch, seen):
    model, dbg = watched(monkeypatch, checked=2.0, unchecked=1.0)
    train(model, dbg, 200)
    checked = [st.step for st in seen if st.names]
    assert checked[:33] == list(range(33))  # the dense start
    assert dbg.cadence.changes == ((0, 1), (33, 4), (69, 42))
    assert [s for s in checked if s > 60] == [64, 68, 84, 126, 168]  # the probe's last, then every 42nd
    assert dbg.interval == 42
    assert dbg.trace().loss.n == 200  # every step's loss is still recorded
    assert dbg.signatures().as_dict()["every"] == 1  # the first steps were checked one by one


def test_a_monitored_run_with_a_cheap_check_checks_every_step(monkeypatch, seen):
    model, dbg = watched(monkeypatch, checked=1.01, unchecked=1.0)
    train(model, dbg, 120)
    assert dbg.cadence.changes == ((0, 1), (33, 4), (69, 1))
    assert [st.step for st in seen if st.names][-51:] == list(range(69, 120))


def test_a_float_loss_spike_makes_the_next_steps_dense(monkeypatch, seen):
    model, dbg = watched(monkeypatch)
    train(model, dbg, 260, loss_at=lambda step, loss: 50.0 if step == 150 else float(loss.detach()))
    checked = [st.step for st in seen if st.names]
    assert list(range(151, 151 + C.DENSE_AFTER_ANOMALY)) == [s for s in checked if 150 < s <= 166]
    assert 167 not in checked
    assert dbg.cadence.alarms == ((150, 151, C.LOSS_SPIKE),)
    assert (151, 1) in dbg.cadence.changes and (167, 42) in dbg.cadence.changes


def test_a_nonfinite_tensor_loss_is_judged_once_on_the_host(monkeypatch, seen):
    """A tensor loss is never read on its own: its anomaly is seen when the monitor's transfer
    brings it to the host (here at each checked step), and the steps after that are dense."""
    model, dbg = watched(monkeypatch, sync_every=1)
    bad = torch.tensor(float("nan"))
    train(model, dbg, 260, loss_at=lambda step, loss: bad if step == 150 else loss)
    (step, dense_from, why), = dbg.cadence.alarms
    assert step == 150 and why == C.NONFINITE_LOSS
    assert dense_from == 169  # the loss reached the host with checked step 168
    checked = [st.step for st in seen if st.names]
    assert list(range(169, 185)) == [s for s in checked if 168 < s < 185]


def test_the_onset_of_an_acute_event_makes_the_cadence_dense(monkeypatch):
    model, dbg = watched(monkeypatch)
    train(model, dbg, 120)
    sched = dbg._cadence
    dbg._add_event(make_event(OPTIMIZER, "plateau", None, 110, 1.0))  # not acute: nothing
    assert sched.dense_until < 120
    dbg._add_event(make_event(DATA, "nan", "0", 112, 1.0))  # noticed at step 120, the monitor's now
    assert sched.dense_until == 121 + C.DENSE_AFTER_ANOMALY
    dbg._add_event(make_event(DATA, "nan", "0", 113, 1.0))  # the same episode: no new window
    assert dbg.cadence.alarms == ((112, 121, "data_anomaly event (nan)"),)


def test_the_cadence_is_recorded_in_the_session(monkeypatch, tmp_path):
    from neuraldbg import load_session
    from neuraldbg.session import SCHEMA_VERSION, trace_from_dict

    model, dbg = watched(monkeypatch)
    train(model, dbg, 260, loss_at=lambda step, loss: 50.0 if step == 150 else float(loss.detach()))
    doc = dbg.session_dict()
    assert doc["version"] == SCHEMA_VERSION == 6
    assert doc["cadence"] == {"every": "auto", "budget": 0.03, "changes": [[0, 1], [33, 4], [69, 42], [151, 1],
                                                                           [167, 42]],
                              "alarms": [[150, 151, "loss spike"]], "changes_omitted": 0, "alarms_omitted": 0}
    trace, _ = trace_from_dict(doc)
    assert trace.cadence == dbg.cadence == dbg.trace().cadence
    path = dbg.export_aquarium_package(tmp_path / "run.json")
    assert load_session(path).trace().cadence == dbg.cadence


def test_a_version_5_session_reads_without_a_cadence_and_a_bad_one_is_refused():
    from neuraldbg.schema import SessionFormatError
    from neuraldbg.session import trace_from_dict

    dbg = NeuralDbg(nn.Linear(4, 2), every=3)
    with dbg:
        pass
    doc = dbg.session_dict()
    assert doc["cadence"]["every"] == 3 and doc["cadence"]["budget"] is None
    old = {k: v for k, v in doc.items() if k != "cadence"}
    old["version"] = 5
    assert trace_from_dict(old)[0].cadence is None
    with pytest.raises(SessionFormatError, match="unknown field 'cadence'"):
        trace_from_dict({**doc, "version": 5})
    for bad, msg in [({"every": 0}, r"cadence\.every: .* valid: an integer >= 1 or \"auto\""),
                     ({"budget": 2.0}, r"cadence\.budget: .* valid: a number in \(0, 1\)"),
                     ({"changes": [[5, 1], [3, 2]]}, r"cadence\.changes\[1\]\[0\]: .* in step order"),
                     ({"changes": [[0, 0]]}, r"cadence\.changes\[0\]\[1\]")]:
        with pytest.raises(SessionFormatError, match=msg):
            trace_from_dict({**doc, "cadence": {**doc["cadence"], **bad}})


def test_resumed_parts_join_their_cadences():
    from neuraldbg.distributed import concat_cadences

    a = CadenceRecord("auto", 0.03, ((0, 1), (33, 4), (65, 7)), ((40, 41, "loss spike"),))
    b = CadenceRecord("auto", 0.05, ((500, 1), (533, 2)))
    joined = concat_cadences(a, b)
    assert joined.changes == a.changes + b.changes and joined.alarms == a.alarms and joined.budget == 0.05
    assert concat_cadences(None, b) is b and concat_cadences(a, None) is a


# ---- training is unchanged ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{}, {"every": "auto", "overhead": 0.5}, {"every": 1}, {"every": 10}])
@pytest.mark.parametrize("set_step", [False, True])
def test_training_is_bitwise_identical_at_every_cadence(kwargs, set_step):
    """120 steps: past the dense start, so an "auto" run checks at an interval it chose (whatever
    the machine's timings) and, with the loss spike at step 70, dense again."""
    data = batches(120, seed=3)
    data[70] = (data[70][0] * 50, data[70][1])  # a loss spike the cadence reacts to
    bare = run(steps=120, data=data, set_step=set_step)
    watched = run(steps=120, data=data, set_step=set_step, monitor=kwargs)
    assert all(torch.equal(a, b) for a, b in zip(bare.losses, watched.losses))
    assert all(torch.equal(a, b) for a, b in zip(bare.model.parameters(), watched.model.parameters()))
    assert watched.dbg.cadence.every == kwargs.get("every", "auto")


def test_choose_interval_sizes_a_sparse_interval_by_isolated_checks():
    # a hot check adding 2 % fits a 3 % aim: every step, however costly an isolated check
    assert C.choose_interval(0.5, 0.02, 1.0, 0.03) == 1
    # a hot check over the aim: the interval an isolated check needs (0.12 / 0.03 = 4), not the
    # hot one's (0.04 / 0.03 -> 2)
    assert C.choose_interval(0.12, 0.04, 1.0, 0.03) == 4
    assert C.choose_interval(0.12, None, 1.0, 0.03) == 4
    assert C.choose_interval(None, 0.04, 1.0, 0.03) == 2  # only hot checks timed so far
    with pytest.raises(ValueError, match="isolated check or of a hot one"):
        C.choose_interval(None, None, 1.0, 0.03)


def test_dense_windows_do_not_make_isolated_checks_look_cheap():
    """Regression: back-to-back checks of dense windows were averaged with isolated ones, so a
    run with many anomalies (the overhead harness's 12-layer BERT: seven windows) sized the
    interval between its windows by checks cheaper than those it pays for there (every 2nd
    step; 1.04x against a 3 % budget). Here a hot check adds 10 %, an isolated one 100 %."""
    sched = AutoSchedule(0.03)
    now = [0.0]

    def cost(step, checked):  # an isolated check doubles its step; one after another adds 10 %
        if not checked:
            return 1.0
        return 1.1 if step - 1 == sched.last_checked_before else 2.0

    sched.last_checked_before = -10

    def tracked(step, checked):
        t = cost(step, checked)
        sched.last_checked_before = step if checked else sched.last_checked_before
        return t

    drive(sched, 400, tracked, now=now)
    assert sched.interval == 42  # 1.25 / 0.03: isolated checks only so far
    for k in range(6):  # anomalies: dense windows of hot checks
        sched.alarm(400 + 40 * k, 400 + 40 * k, C.LOSS_SPIKE)
        drive(sched, 440 + 40 * k, tracked, start=400 + 40 * k, now=now)
    assert len(sched._hot_times) >= C.MIN_SAMPLES
    drive(sched, 1200, tracked, start=640, now=now)
    # hot checks (0.1 / 0.024 -> 5) do not fit the aim, and isolated ones size the interval
    assert sched.interval == 42


def test_host_transfers_count_apart_and_a_gap_between_steps_does_not_count():
    """The monitor's host transfer (one per ``sync_every`` checks) is timed on its own and spread
    over the checks; a pause between two steps that lands in a check's span (a validation pass,
    another model's steps: the overhead harness's bare blocks) is not the check's cost."""
    busy = [0.0]

    def run(transfer, gap_every=None):
        sched = AutoSchedule(0.03, busy=lambda: busy[0])
        busy[0] = 0.0

        def cost(step, checked):
            t = 2.0 if checked else 1.0  # a check doubles its step: every 42nd without transfers
            if checked and sched.checks % 16 == 0:  # a transfer, inside this check's span
                busy[0] += transfer
                t += transfer
            if gap_every and step % gap_every == gap_every - 1:
                t += 100.0
            return t

        drive(sched, 2000, cost)
        return sched.interval

    assert run(0.0) == 42
    # 16 units per 16 checks: a check costs 1 more, extra 2.0 over the unchecked 1.0 -> 2.5 / 0.03
    # = 84, within the band (the transfers so far spread over the checks so far)
    n = run(16.0)
    assert with_hysteresis(n, 84) == n and n > 42 * (1 + C.BAND)
    # a 100-step pause every 97 steps lands in some checks' spans: not their cost
    assert run(0.0, gap_every=97) == 42
