"""Signature evidence: step size, initial weight scale, target faults, chance-level loss start."""
from __future__ import annotations

import math

import pytest

from neuraldbg.causal.evidence import extract
from neuraldbg.causal.nodes import causes as G
from neuraldbg.causal.nodes.data import back_to_chance
from neuraldbg.events.base import DATA, GRADIENT, OPTIMIZER, make_event
from neuraldbg.trace import LayerInfo
from tests.tiny import make_trace

LAYERS = (LayerInfo("fc1", "Linear", 0, 10), LayerInfo("act", "ReLU", 1, 0), LayerInfo("fc2", "Linear", 2, 10))


def trace(losses=(), sigs=None, events=(), family="mlp", nonfinite_step=None):
    return make_trace(events, LAYERS, list(losses), family=family, sigs=sigs, nonfinite_step=nonfinite_step,
                      steps=max(len(losses), 1))


@pytest.mark.parametrize("ratio,state", [(None, None), (1e-8, "tiny"), (9.9e-5, "tiny"), (1e-4, "small"),
                                         (3.9e-3, "small"), (4e-3, "normal"), (0.05, "normal"), (0.1, "elevated"),
                                         (0.2, "elevated"), (0.5, "large"), (40.0, "large")])
def test_step_size_cut_points(ratio, state):
    assert G.step_size_state(ratio) == state


def test_small_and_tiny_read_the_fastest_layer_large_the_median():
    # a slow median with one layer moving at a healthy rate is not a small step
    assert G.step_size_state(1e-3, 0.01) == "normal" and G.step_size_state(1e-3, 2e-3) == "small"
    assert G.step_size_state(5e-5, 2e-4) == "small" and G.step_size_state(5e-5, 5e-5) == "tiny"


def test_extreme_reads_the_largest_step_of_the_median_layer():
    # weights blown up by their first steps shrink the later ratios back into "large": only
    # the first updates tell a rate 100x too high (12x the weights per step) from a bold healthy one
    assert G.step_size_state(0.3, 0.5, 12.0) == "extreme"
    assert G.step_size_state(0.25, 0.4, 0.51) == "large"  # the boldest healthy run of both suites
    assert G.step_size_state(0.02, 0.03, 0.76) == "extreme"
    assert G.step_size_state(0.02, 0.03, 0.75) == "normal"  # the cut itself: three quarters of a norm
    # regression: a 4-layer nn.TransformerEncoder at lr x100 peaked at 0.97-0.98, under the
    # earlier cut of one norm, and read architecture/unstable and data/corrupted
    assert G.step_size_state(0.22, 0.39, 0.978) == "extreme"
    assert G.step_size_state(0.02, 0.03, None) == "normal"  # not measured: the median decides


@pytest.mark.parametrize("f,state", [(None, None), (0.0, "normal"), (0.49, "normal"), (-0.49, "normal"), (0.6, "large"),
                                     (1.5, "large"), (-2.0, "small")])
def test_init_scale_cut_points(f, state):
    assert G.init_scale_state(f) == state


def test_back_to_chance_needs_learning_then_a_return():
    ref = math.log(10)
    learned_then_back = [ref] * 10 + [0.3 * ref] * 40 + [ref] * 20
    assert back_to_chance(learned_then_back, ref)
    assert not back_to_chance([ref * (1 - i / 100) for i in range(70)], ref)  # slow steady learning
    assert not back_to_chance([ref] * 70, ref)  # never learned (lr too low): not a target fault
    assert not back_to_chance([ref] * 10 + [0.3 * ref] * 60, ref)  # learned and stayed
    spike = [ref] * 10 + [0.3 * ref] * 30 + [2 * ref] + [0.3 * ref] * 29
    assert not back_to_chance(spike, ref)  # one bad batch is not a return
    blown = [ref] * 10 + [0.3 * ref] * 40 + [40 * ref] * 20
    assert not back_to_chance(blown, ref)  # far above chance: a blow-up, not a label fault


def test_back_to_chance_is_measured_against_what_was_learned_and_the_noise():
    """Regression: a return counted only after the loss had fallen below 0.6x chance, so a slow
    learner (a LoRA fine-tune, a small convolution net at 0.8x chance) whose labels were then
    shuffled read no return, and its stall was blamed on causes that never let a run learn."""
    ref = math.log(4)
    slow = [ref] * 10 + [0.8 * ref] * 40 + [ref] * 20
    assert back_to_chance(slow, ref)
    assert not back_to_chance([ref] * 10 + [0.97 * ref] * 40 + [ref] * 20, ref)  # 3 % is no learning
    # a tail that wiggles by more than a fifth of its rise is noise, not a return
    wiggle = [0.2 * ref * (-1) ** i for i in range(20)]
    noisy = [ref] * 10 + [0.9 * ref] * 40 + [ref + w for w in wiggle]
    assert not back_to_chance(noisy, ref)
    calm = [ref] * 10 + [0.9 * ref] * 40 + [ref + w / 40 for w in wiggle]
    assert back_to_chance(calm, ref)


def test_a_return_from_above_chance_is_not_read_as_a_falling_loss():
    """Regression: a language model's first loss sits above ``ln K``; after its labels were
    shuffled its loss went back to chance, still below where it began, and the same curve read
    "decreasing" -- a healthy run's pattern -- beside the return (a LoRA GPT-2 read healthy)."""
    ref = math.log(10)
    ev = extract(trace(losses=[1.3 * ref] * 10 + [0.7 * ref] * 40 + [ref] * 20, sigs={"out_features": 10}))
    assert ev.observed["target_fault"] == "back_to_chance"
    assert "loss_pattern" not in ev.observed and "started above" in ev.unobserved["loss_pattern"]


def test_a_return_to_chance_is_read_once():
    """Regression: a loss that learned and then went back to chance (shuffled labels) was read
    three times -- target_fault "back_to_chance", loss_pattern "flat" and progress "stalled" --
    and the last two, counted as independent witnesses, blamed causes that never let a run
    learn (a learning rate too low, the 'unexplained' leak)."""
    from neuraldbg.causal.nodes.loss import RETURN_PATTERNS
    ref = math.log(10)
    tr = trace(losses=[ref] * 10 + [0.3 * ref] * 40 + [ref] * 20, sigs={"out_features": 10})
    ev = extract(tr)
    assert ev.observed["target_fault"] == "back_to_chance"
    assert ev.observed["loss_pattern"] == RETURN_PATTERNS  # "one of the shapes a return draws"
    assert "progress" not in ev.observed and "went back to chance" in ev.unobserved["progress"]
    from neuraldbg.causal import api
    assert "reads one of 'slow', 'flat', 'spike', 'divergence'" in api.causal_chain(tr, "data_anomaly").reason
    # a run that never learned keeps its flat pattern and its stall
    never = extract(trace(losses=[ref] * 70, sigs={"out_features": 10}))
    assert never.observed["target_fault"] == "absent"
    assert never.observed["loss_pattern"] == "flat" and never.observed["progress"] == "stalled"


@pytest.mark.parametrize("first,state", [(2.3, "normal"), (0.5, "normal"), (3.1, "normal"), (9.0, "normal"),
                                         (9.3, "high"), (500.0, "high")])
def test_loss_start_against_chance_level(first, state):
    """ln 10 = 2.30: an untrained 10-way classifier starts there, a pre-trained one below, and
    one fine-tuned on a new distribution somewhat above it; 4x above is a blown-up forward pass."""
    tr = trace(losses=[first] + [0.5] * 29, sigs={"out_features": 10})
    assert extract(tr).observed["loss_start"] == state


def test_signatures_read_from_the_trace():
    tr = trace(losses=[2.3] * 30, sigs={"step_ratio_median": 2e-8, "init_scale_log10": 0.1, "out_features": 10})
    ev = extract(tr)
    assert ev.observed["step_size"] == "tiny" and ev.observed["init_scale"] == "normal"
    assert ev.observed["target_fault"] == "absent"
    assert "update/weight ratio" in ev.notes["step_size"]


def test_an_undeclared_signature_is_an_error():
    """Regression: a misspelt signature name used to read as 'not measured'."""
    with pytest.raises(KeyError, match="undeclared signature 'step_ratio_peek'"):
        trace(losses=[2.3] * 30, sigs={"step_ratio_peek": 2e-8})
    with pytest.raises(TypeError, match="read by their declaration"):
        trace(losses=[2.3] * 30).signatures.number("step_ratio_median")


def test_without_measurements_signatures_are_unobserved():
    ev = extract(trace(losses=[1.0] * 5))
    assert "step_size" not in ev.observed and "init_scale" not in ev.observed
    assert "target_fault" not in ev.observed  # too few losses to tell a return to chance


def test_nonfinite_loss_with_finite_network_points_at_the_targets():
    losses = [1.0 - 0.01 * i for i in range(30)] + [math.nan] + [0.7] * 9
    tr = trace(losses=losses, nonfinite_step=30, events=[
        make_event(OPTIMIZER, "divergence", None, 30, 5.0, {"nonfinite": 1.0}),  # the NaN loss itself
        make_event(DATA, "nan", "fc1", 31, 6.0, {"at_input": 0.0})])             # poisoned weights after
    ev = extract(tr)
    assert ev.observed["target_fault"] == "nonfinite_loss_first"
    # the NaN loss is not the instability that "preceded" the NaN born inside
    assert ev.observed["data_nan"] == "inside_sudden"


def test_regression_a_nonfinite_loss_at_an_unchecked_step_is_no_target_evidence():
    """Under a sparse cadence a loss turned non-finite at a step the monitor did not check: its
    inputs and outputs were never seen, so "finite while the loss was not" is unknown (a NaN born
    inside a U-Net at such a step read as corrupted targets)."""
    from dataclasses import replace

    from neuraldbg.trace import CadenceRecord

    losses = [1.0 - 0.01 * i for i in range(30)] + [math.nan] + [0.7] * 9
    base = trace(losses=losses, nonfinite_step=30, events=[
        make_event(OPTIMIZER, "divergence", None, 30, 5.0, {"nonfinite": 1.0}),
        make_event(DATA, "nan", "fc1", 31, 6.0, {"at_input": 0.0})])
    sparse = CadenceRecord("auto", 0.03, ((0, 1), (20, 4), (31, 1)), ((30, 31, "non-finite loss"),))
    ev = extract(replace(base, cadence=sparse))
    assert "target_fault" not in ev.observed
    assert "step 30, which was not checked" in ev.unobserved["target_fault"]
    checked = CadenceRecord("auto", 0.03, ((0, 1), (20, 5), (31, 1)))  # step 30 is a multiple of 5
    assert extract(replace(base, cadence=checked)).observed["target_fault"] == "nonfinite_loss_first"


def test_nonfinite_loss_after_blow_up_is_not_a_target_fault():
    losses = [1.0] * 20 + [50.0, 500.0, math.inf]
    tr = trace(losses=losses, nonfinite_step=22, events=[
        make_event(GRADIENT, "exploding", "fc1", 19, 3.0, {}),
        make_event(DATA, "inf", "fc2", 22, 6.0, {"at_input": 0.0})])
    assert extract(tr).observed["target_fault"] == "absent"


def test_loss_start_uses_chance_level_not_the_later_loss():
    fast = [math.log(10) * 1.1] + [0.01] * 40  # a fast learner: 200x drop, still starts at chance
    assert extract(trace(losses=fast, sigs={"out_features": 10})).observed["loss_start"] == "normal"
    blown = [80.0] + [0.5] * 40
    assert extract(trace(losses=blown, sigs={"out_features": 10})).observed["loss_start"] == "high"


def test_vanishing_on_an_improving_loss_is_not_evidence():
    van = make_event(GRADIENT, "vanishing", "fc1", 0, 2.0, {"out_rms": 0.5})
    improving = [2.0 * 0.97 ** i for i in range(60)]
    ev = extract(trace(losses=improving, events=[van]))
    assert "vanishing" not in ev.observed and "loss keeps improving" in ev.notes["vanishing"]
    stuck = [2.0] * 60
    assert extract(trace(losses=stuck, events=[van])).observed["vanishing"] == "init_depth"


@pytest.mark.parametrize("first,tail,chance,frac", [(1.0, 1.5, 3.0, 0.25), (1.0, 3.0, 3.0, 1.0),
                                                    (1.0, 0.5, 3.0, -0.25), (1.0, 1.5, None, 0.5),
                                                    (2.0, 3.0, 1.5, 0.5), (0.0, 1.0, None, None)])
def test_retention_fraction_is_the_share_of_the_margin_to_chance(first, tail, chance, frac):
    got = G.retention_fraction(first, tail, chance)
    assert got == (None if frac is None else pytest.approx(frac))


@pytest.mark.parametrize("frac,state", [(None, None), (-0.3, "kept"), (0.17, "kept"), (0.25, "kept"), (0.3, "partial"),
                                        (0.5, "partial"), (0.56, "lost"), (1.2, "lost")])
def test_retention_cut_points(frac, state):
    assert G.retention_state(frac) == state


def test_retention_read_from_the_trace():
    """ln 28 = 3.33: a reference that went from 0.94 to 2.4 gave up 61% of its margin to chance
    (the zoo's LoRA fine-tune at a 50x step size); 0.94 to 1.36 (its healthy run) 18%."""
    sigs = {"out_features": 28, "reference_first": 0.94, "reference_n": 16}
    lost = extract(trace(losses=[1.0] * 30, sigs={**sigs, "reference_tail": 2.4}))
    assert lost.observed["retention"] == "lost" and "61% of its margin to chance" in lost.notes["retention"]
    assert extract(trace(losses=[1.0] * 30, sigs={**sigs, "reference_tail": 1.36})).observed["retention"] == "kept"
    few = extract(trace(losses=[1.0] * 30, sigs={**sigs, "reference_n": 2, "reference_tail": 2.4}))
    assert "retention" not in few.observed  # a start and one more value say nothing of a trend
    assert "retention" not in extract(trace(losses=[1.0] * 30, sigs=sigs)).observed  # a non-finite tail


def test_a_run_that_started_trained_is_no_return_to_chance():
    """Regression: a fine-tune of a loaded trained state_dict (first loss 0.26x chance) that
    hovered around its own start read ``back_to_chance`` against that start, and
    ``data/corrupted`` (0.37) made the healthy fine-tune read not healthy. A run that started
    trained is measured against chance level only."""
    ref = math.log(3)
    hover = [0.29, 0.2, 0.15] * 4 + [0.08] * 20 + [0.27, 0.3, 0.28] * 10
    plain = extract(trace(losses=hover, sigs={"out_features": 3}))
    assert plain.observed["target_fault"] == "back_to_chance"  # against its own start, as before
    started = extract(trace(losses=hover, sigs={"out_features": 3, "started_trained": "not at initialization"}))
    assert started.observed["target_fault"] == "absent"  # 0.28 is far from ln 3 = 1.10
    back = [0.29] * 10 + [0.1] * 30 + [ref] * 20  # a real return to chance is still seen
    assert extract(trace(losses=back, sigs={"out_features": 3, "started_trained": "x"})).observed[
        "target_fault"] == "back_to_chance"
    unknown = extract(trace(losses=hover, sigs={"started_trained": "x"}))
    assert "target_fault" not in unknown.observed
