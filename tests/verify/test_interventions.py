"""Each intervention end to end on a small run, and the case observation alone cannot settle:
a learning-rate blow-up against an init blow-up that the network sees identically."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from neuraldbg.causal import api as capi
from neuraldbg.verify import api
from neuraldbg.verify.interventions import INTERVENTIONS, get_intervention, register_intervention
from neuraldbg.verify.snapshots import of
from verify_cases import blind_priors, finetune, train, train_attention

STEPS = 40


def _test(v, label):
    return next(t for t in v.tests if t.label == label)


@pytest.fixture(scope="module")
def blind(tmp_path_factory):
    # only the dead-unit evidence is informative: both blow-ups kill ReLU units after the
    # first steps, so the two runs below give the network the very same evidence
    return blind_priors(tmp_path_factory.mktemp("priors") / "blind.json", keep=("dead",))


@pytest.mark.parametrize("truth,fault", [(("learning_rate", "too_high"), dict(lr=5.0)),
                                         (("initialization", "too_large"), dict(gain=30.0))])
def test_ambiguous_blow_up_verification_picks_the_right_cause(blind, truth, fault):
    _, _, dbg, replay = train(steps=STEPS, priors=blind, **fault)
    before = dbg.posterior()
    # observation alone: the same posterior for either blow-up, the init one not even on top
    assert 0.1 < before["initialization"]["too_large"] < before["learning_rate"]["too_high"] < 0.6
    v = dbg.verify(replay)
    top = v.hypotheses[0]
    assert (top.cause, top.state) == truth and top.probability > 0.5, v
    assert top.verified is True and top.probability_before == pytest.approx(before[truth[0]][truth[1]])
    other = ("initialization", "too_large") if truth[0] == "learning_rate" else ("learning_rate", "too_high")
    assert _test(v, "/".join(other)).verified is not True
    assert v.posterior[other[0]][other[1]] < top.probability


@pytest.mark.parametrize("label,fault", [
    ("learning_rate/too_high", dict(lr=5.0)),
    ("learning_rate/too_low", dict(lr=0.005)),      # 10x too low: x10 is the fix
    ("initialization/too_small", dict(gain=0.01)),
    ("initialization/too_large", dict(gain=30.0)),
    ("data/corrupted", dict(nan_at=20)),
    ("data/shifted", dict(shift_at=20)),
])
def test_each_intervention_removes_its_own_fault(label, fault):
    _, _, dbg, replay = train(steps=STEPS, **fault)
    v = dbg.verify(replay)
    t = _test(v, label)
    assert t.outcome == "vanished" and t.acted > 0, t
    top = v.hypotheses[0]
    assert f"{top.cause}/{top.state}" == label and top.verified is True
    assert v.extra_steps == sum(x.steps for x in v.tests) <= 3 * 20 + 3 * 5


def test_gradient_clip_end_to_end_and_its_untestable_cases():
    _, _, dbg, replay = train(steps=STEPS, lr=1.0)
    snaps, trace = of(dbg), dbg.trace()
    base = dbg.get_causal_hypotheses()[0]
    exploding = dataclasses.replace(base, cause="architecture", state="unstable", failure_type="exploding_gradients")
    t = api._run_test(dbg, snaps, replay, exploding, trace, 20)
    assert t.outcome == "vanished" and t.acted == t.steps > 0, t
    vanishing = dataclasses.replace(exploding, failure_type="vanishing_gradients")
    t = api._run_test(dbg, snaps, replay, vanishing, trace, 20)
    assert t.outcome == "untestable" and t.steps == 0 and "gradient clip" in t.reason


def test_healthy_run_stays_healthy():
    _, _, dbg, replay = train(steps=STEPS)
    v = dbg.verify(replay)
    assert v.posterior.p_healthy > 0.9 and not any(h.probability >= 0.2 for h in v.hypotheses)
    # a x10 learning rate may well learn faster here for a few steps (lr 0.05 is not the best
    # rate of this task): the likelihoods count on that, and the run stays healthy
    assert {t.label for t in v.tests if t.outcome == "vanished"} <= {"learning_rate/too_low"}
    # interventions that find nothing to act on leave the replay identical to the run
    assert all(t.improvement == 0.0 for t in v.tests if t.outcome == "persisted" and t.acted == 0)


def test_registry_covers_every_abnormal_state_and_rejects_unknown_ones():
    from neuraldbg.vocab import ROOTS

    from neuraldbg.verify.likelihoods import TESTED_LABELS, UNTESTED

    assert {f"{c}/{s}" for c, s in INTERVENTIONS} == set(TESTED_LABELS)
    assert set(TESTED_LABELS) | set(UNTESTED) == {f"{c}/{s}" for c, ss in ROOTS.items() for s in ss if s != "ok"}
    assert get_intervention("learning_rate", "too_high").from_start is False
    assert get_intervention("initialization", "too_small").from_start is True
    with pytest.raises(ValueError, match="valid: learning_rate/too_high"):
        register_intervention("learning_rate", "ok")
    with pytest.raises(ValueError, match="no abnormal root state optimizer/broken"):
        register_intervention("optimizer", "broken")


def test_reinit_skips_frozen_and_zero_weights():
    from torch import nn

    from neuraldbg.monitor.measurements.weights import reference_stds
    from neuraldbg.verify.interventions import off_scale

    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    with torch.no_grad():
        model[0].weight.mul_(100)           # off: found
        model[1].weight.mul_(100)
        model[1].weight.requires_grad_(False)  # frozen (loaded, not initialized): left alone
        model[2].weight.zero_()             # zero by design: left alone
    found = [name for name, *_ in off_scale(model, reference_stds)]
    assert found == ["0"]


def test_attention_collapse_symptom_vanishes_under_reinit():
    """Regression: query/key weights 30x too large collapse every attention row from step 0;
    the collapse was not seen (underflowed rows read as one open key) and the re-initialization
    test judged the loss alone. Now the saturation is the hypothesis' symptom, and the replay
    from step 0 shows it gone."""
    _, _, dbg, replay = train_attention(qk_gain=30.0)
    sat = [e for e in dbg.events if e.kind == "saturated"]
    assert sat and sat[0].layer == "softmax" and sat[0].step == 0
    v = dbg.verify(replay, steps=20, top=3)
    test = _test(v, "initialization/too_large")
    assert test.layers == ("qkv",) and test.start_step == 0
    assert test.symptoms >= 1 and test.symptoms_after == 0 and test.outcome == "vanished"
    assert "the symptom vanished" in test.sentence() and "0 of the same kind in the replay" in test.sentence()
    assert v.posterior["initialization"]["too_large"] > v.posterior_before["initialization"]["too_large"]
    top = v.hypotheses[0]
    assert (top.cause, top.state, top.verified) == ("initialization", "too_large", True)


def test_healthy_attention_has_no_symptom_to_test():
    _, _, dbg, replay = train_attention(qk_gain=1.0)
    assert not [e for e in dbg.events if e.kind == "saturated"]
    v = dbg.verify(replay, steps=20, top=3)
    assert all(t.symptoms == 0 for t in v.tests)
    assert v.posterior.p_healthy > 0.5


def test_healthy_fine_tune_keeps_its_reference_and_is_not_confirmed():
    _, _, dbg, replay = finetune(lr=1e-3)
    assert capi.evidence(dbg.trace()).observed["retention"] == "kept"
    v = dbg.verify(replay, top=2)
    assert all(t.reference_gain is None for t in v.tests)  # a kept reference is no symptom
    assert all(t.outcome != "vanished" for t in v.tests if t.label == "learning_rate/too_high")
    assert v.posterior.p_healthy > 0.9


@pytest.mark.parametrize("lr", [3e-3, 3e-2])
def test_forgetting_a_task_the_fine_tune_overwrites_is_not_blamed_on_the_rate(lr):
    """B mostly replaces A: every rate that learns B forgets A, and a rate /10 keeps A better
    only by learning B as much more slowly. That trade is no evidence of a step size too large."""
    _, _, dbg, replay = finetune(lr=lr, conflict=3.0)
    assert capi.evidence(dbg.trace()).observed["retention"] == "lost"
    v = dbg.verify(replay, top=2)
    t = _test(v, "learning_rate/too_high")
    assert t.outcome == "persisted" and t.reference_gain > 0.3 and t.improvement < -0.3
    assert v.posterior["learning_rate"]["too_high"] <= v.posterior_before["learning_rate"]["too_high"]
