"""Ranked hypotheses, explain_failure and causal chains on hand-built scenario traces."""
import dataclasses
import json

import pytest

from neuraldbg.causal import api
from neuraldbg.causal.hypotheses import REPORT_FLOOR
from neuraldbg.causal.types import Hypothesis
from neuraldbg.events.base import FAILURE_TYPES
from neuraldbg.vocab import ABNORMAL_LABELS
from scenarios import SCENARIOS, decreasing, grad, loss_event, nan_batch, nan_inside, nan_sudden, trace
from tests.tiny import signatures


@pytest.mark.parametrize("name", [n for n, (_, truth) in SCENARIOS.items() if truth is not None])
def test_scenario_top1(name):
    build, truth = SCENARIOS[name]
    hyps = api.hypotheses(build())
    assert hyps, name
    assert (hyps[0].cause, hyps[0].state) == truth
    assert [h.probability for h in hyps] == sorted((h.probability for h in hyps), reverse=True)
    assert all(h.probability >= REPORT_FLOOR for h in hyps)


def test_healthy_trace_reports_nothing_and_high_p_healthy():
    tr = SCENARIOS["healthy"][0]()
    assert api.hypotheses(tr) == []
    post = api.posterior(tr)
    assert post.p_healthy > 0.9
    assert all(p < REPORT_FLOOR for _, _, p in post.abnormal())


@pytest.mark.parametrize("name,layer,step,ftype", [
    ("nan_batch", "0", 30, "data_anomaly"),
    ("data_shift", "0", 30, "data_anomaly"),
    ("lr_too_high", "0", 2, "exploding_gradients"),
    ("init_too_small", "0", 0, "vanishing_gradients"),
    ("sigmoid_stack", "0", 0, "vanishing_gradients"),
])
def test_origin_onset_and_failure_type(name, layer, step, ftype):
    h = api.hypotheses(SCENARIOS[name][0]())[0]
    assert (h.origin_layer, h.onset_step, h.failure_type) == (layer, step, ftype)
    assert h.evidence and all(e.step >= 0 for e in h.evidence)


def test_nan_born_inside_is_not_blamed_on_the_data():
    h = api.hypotheses(nan_inside())[0]
    assert (h.cause, h.state) == ("learning_rate", "too_high")
    assert api.posterior(nan_inside())["data"]["corrupted"] < 0.05
    assert h.origin_layer == "2"


def test_nan_born_inside_a_calm_run_points_at_the_data():
    h = api.hypotheses(nan_sudden())[0]
    assert (h.cause, h.state, h.origin_layer, h.onset_step) == ("data", "corrupted", "2", 40)


def test_hypothesis_record_contract():
    h = api.hypotheses(nan_batch())[0]
    assert isinstance(h, Hypothesis)
    assert str(h) == h.description
    for token in ("data", "corrupted", "`0`", "step 30", f"{h.probability:.2f}"):
        assert token in h.description
    assert "step 30" in h.suggested_fix and "NaN" in h.suggested_fix
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.probability = 0.5
    json.dumps(h.to_dict(), allow_nan=True)
    hash(h)
    # no tensors anywhere: plain values, and events whose fields are plain values
    plain = (str, int, float, type(None), tuple)
    for f in dataclasses.fields(h):
        assert isinstance(getattr(h, f.name), plain), f.name
    for e in h.evidence:
        assert all(isinstance(getattr(e, f.name), plain) for f in dataclasses.fields(e))


@pytest.mark.parametrize("name,needle", [
    ("lr_too_high", "Lower the learning rate about 10x"),
    ("lr_too_low", "Raise the learning rate about 10x"),
    ("init_too_small", "Kaiming"),
    ("init_too_large", "Kaiming/Xavier"),
    ("nan_batch", "NaN/Inf batch at step 30"),
    ("data_shift", "Normalize inputs"),
    ("sigmoid_stack", "swap sigmoid/tanh for ReLU/GELU"),
])
def test_suggested_fixes_are_specific(name, needle):
    h = api.hypotheses(SCENARIOS[name][0]())[0]
    assert needle in h.suggested_fix
    assert h.suggested_fix.endswith(".")


def test_fix_quotes_the_learning_rate_when_known():
    tr = dataclasses.replace(SCENARIOS["lr_too_high"][0](), signatures=signatures({"lr": (50.0,)}))
    assert "currently 50" in api.hypotheses(tr)[0].suggested_fix


def test_explain_filters_by_failure_type():
    tr = SCENARIOS["data_shift"][0]()
    all_h = api.explain(tr, None)
    assert [(h.cause, h.state) for h in all_h] == [(h.cause, h.state) for h in api.hypotheses(tr)]
    data = api.explain(tr, "data_anomaly")
    assert (data[0].cause, data[0].state) == ("data", "shifted")
    assert {h.failure_type for h in data} == {"data_anomaly"}
    expl = api.explain(tr, "exploding_gradients")
    assert expl and expl[0].failure_type == "exploding_gradients" and expl[0].onset_step == 30
    assert api.explain(tr, "saturated_activations") == []  # did not occur


def test_explain_unknown_type_names_the_valid_ones():
    with pytest.raises(ValueError) as exc:
        api.explain(SCENARIOS["healthy"][0](), "gradient_explosion")
    for ft in FAILURE_TYPES:
        assert ft in str(exc.value)
    with pytest.raises(ValueError, match="valid"):
        api.causal_chain(SCENARIOS["healthy"][0](), "nope")


def test_chain_runs_from_root_cause_through_its_own_first_event():
    """Regression: a chain of one failure type held the cause's other evidence too (a data shift
    at step 30 heading a vanishing-gradients chain; vanishing events in an exploding one)."""
    tr = SCENARIOS["data_shift"][0]()
    ch = api.causal_chain(tr, "vanishing_gradients")
    assert (ch.cause, ch.state) == ("data", "shifted")
    assert ch.first_event.kind == "vanishing" and ch.first_step > 30  # the shift entered at 30
    assert {e.kind for e in ch.events} == {"vanishing"}
    steps = [e.step for e in ch.events]
    assert steps == sorted(steps)
    assert str(ch).startswith("vanishing_gradients: data shifted (p = ")
    assert bool(ch) and ch.reason == ""


def test_chain_is_empty_with_a_reason_when_the_failure_did_not_occur():
    ch = api.causal_chain(SCENARIOS["healthy"][0](), "exploding_gradients")
    assert not ch and ch.empty and ch.cause is None and ch.first_event is None
    assert "no exploding_gradients event" in ch.reason
    assert "no chain" in str(ch)


def test_chain_of_a_nan_batch():
    ch = api.causal_chain(nan_batch(), "data_anomaly")
    assert (ch.cause, ch.state, ch.first_layer, ch.first_step) == ("data", "corrupted", "0", 30)


def test_floor_is_adjustable():
    tr = SCENARIOS["lr_too_low"][0]()
    assert len(api.hypotheses(tr, floor=0.0)) == len(ABNORMAL_LABELS)  # every abnormal state
    assert api.hypotheses(tr, floor=0.99) == []


def test_a_data_fault_does_not_claim_events_before_it_entered():
    tr = trace([grad("exploding", "2", 12, 14, grad_rms=5.0), loss_event("spike", 13),
                *nan_batch(40).events], losses=decreasing(40) + [float("nan")] * 20)
    h = api.hypotheses(tr)[0]
    assert (h.cause, h.state, h.origin_layer, h.onset_step) == ("data", "corrupted", "0", 40)
    assert min(e.step for e in h.evidence) == 40


def test_a_forgotten_reference_is_named_in_the_sentence_and_the_fix():
    """A fine-tune that learns its task (no event, a falling loss) while its reference loss rises
    halfway to chance: the hypothesis says so, not 'first seen in the loss at an unknown step'."""
    sigs = (("lr", (0.05,)), ("out_features", 28), ("reference_first", 0.94), ("reference_n", 16),
            ("reference_tail", 2.4), ("step_ratio_median", 0.15))
    top = api.hypotheses(trace([], losses=decreasing(), family="lora", sigs=sigs))[0]
    assert (top.cause, top.state) == ("learning_rate", "too_high")
    assert "forgot its reference task" in top.description and "61% of its margin" in top.description
    assert "overwrite what the model knew" in top.suggested_fix and "(currently 0.05)" in top.suggested_fix
    assert top.origin_layer is None and top.evidence == ()


def test_decisive_is_the_largest_likelihood_ratio():
    from neuraldbg.causal.hypotheses import decisive

    assert decisive({"exploding": 40.0, "stale_grads": 1.9e4, "progress": 190.0}) == "stale_grads"
    assert decisive({"a": 2.0, "b": 2.0}) == "b"  # ties: by name, so the same run reads the same
    assert decisive({}) is None


def test_the_headline_cites_the_zero_grad_check_not_the_spike_it_caused():
    """Regression: with ``zero_grad`` missing, the sentence named the first supporting event
    (a loss spike at step 43, 'optimizer instability first seen in the loss') while the
    zero-grad check had carried the hypothesis from its first examined steps."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from neuraldbg import NeuralDbg

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(16, 4, generator=gen)
    with NeuralDbg(model) as dbg:
        for _ in range(60):
            x = torch.randn(32, 16, generator=gen)
            loss = F.cross_entropy(model(x), (x @ teacher).argmax(1))
            loss.backward()  # no opt.zero_grad(): the gradients pile up
            dbg.record_loss(loss)
            opt.step()
    top = dbg.get_causal_hypotheses()[0]
    assert (top.cause, top.state) == ("training_loop", "stale_gradients")
    assert top.evidence, "the run must also show events, or the old sentence would cite the check too"
    assert top.description.startswith("training loop: stale gradients (p = ")
    assert "examined optimizer steps ran on gradients left from before the previous step" in top.description
    assert "first seen in" not in top.description
