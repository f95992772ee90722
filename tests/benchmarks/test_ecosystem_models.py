"""The ecosystem suite: library models train under NeuralDbg and their faults do what they say."""
from __future__ import annotations

import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub

eco = pytest.importorskip("benchmarks.ecosystem")
from benchmarks.ecosystem.training import Build  # noqa: E402

STEPS = 40


def _mean(xs):
    return sum(xs) / len(xs)


def test_interface_mirrors_the_zoo():
    import models

    assert set(eco.family(a) for a in eco.architectures()) <= set(models.FAMILIES)
    assert eco.family("pyg_gcn") == "gnn" and eco.family("lora_bert") == "lora"
    for arch in eco.architectures():
        injs = eco.injections(arch)
        assert injs[0].name == "healthy" and injs[0].truth is None and injs[0].onset is None
        for inj in injs[1:]:  # a fault has a truth and an onset; a healthy control (a twin) neither
            assert (inj.truth is None) == (inj.onset is None)
    with pytest.raises(ValueError, match="valid: hf_gpt2"):
        eco.run("no_such_arch")
    with pytest.raises(ValueError, match="valid: healthy"):
        eco.run("torch_lstm", "labels_shuffled")  # a regression task has no labels
    runs = eco.suite_runs(quick=False)
    assert sum(1 for _, n, _ in runs if n == "healthy") >= 100
    assert len(eco.suite_runs(quick=True)) < len(runs) / 2
    # an arch with its own injection list runs only those in the suite
    assert {n for a, n, _ in runs if a == "torch_encoder_deep"} == {"healthy", "no_warmup", "lr_x100", "lr_div1e4"}


def test_an_arch_outside_the_suite_runs_only_when_named(monkeypatch):
    import dataclasses

    archs = dict(eco._ARCHS)
    archs["torch_lstm"] = dataclasses.replace(archs["torch_lstm"], in_suite=False)
    monkeypatch.setattr(eco, "_ARCHS", archs)
    assert not any(a == "torch_lstm" for quick in (False, True) for a, _, _ in eco.suite_runs(quick=quick))
    assert "torch_lstm" in eco.architectures() and eco.injections("torch_lstm")[0].name == "healthy"


@pytest.mark.parametrize("arch,library", [("torch_lstm", "torch"), ("pyg_gcn", "torch_geometric"),
                                          ("hf_llama", "transformers"), ("hf_t5", "transformers")])
def test_healthy_learns_under_the_monitor(arch, library):
    pytest.importorskip(library)
    r = eco.run(arch, "healthy", seed=0, steps=STEPS, monitor=True, threads=1)
    assert r.dbg is not None and r.truth is None and r.family == eco.family(arch)
    assert len(r.losses) == STEPS and all(math.isfinite(v) for v in r.losses)
    assert _mean(r.losses[-5:]) < 0.8 * _mean(r.losses[:5])
    # the layer names the suite reports are the monitor's
    names = {layer.name for layer in r.dbg.layers()}
    spec = eco.get_arch(arch)
    assert spec.input_layer in names and spec.init_layer in names


@pytest.mark.parametrize("arch,injection,truth,library", [
    ("torch_lstm", "nan_input", ("data", "corrupted"), "torch"),
    ("pyg_gcn", "lr_x100", ("learning_rate", "too_high"), "torch_geometric"),
    ("hf_llama", "inputs_rescaled", ("data", "shifted"), "transformers"),
])
def test_injection_truth_and_effect(arch, injection, truth, library):
    pytest.importorskip(library)
    r = eco.run(arch, injection, seed=3, steps=STEPS, monitor=True, threads=1)  # bf16 + accumulation
    assert r.dbg is not None and r.truth == truth
    assert r.metrics["bf16"] == 1.0 and r.metrics["accumulation"] == 2.0
    if injection == "nan_input":
        assert r.onset == round(0.4 * STEPS) and r.layer == "lstm"
        assert not math.isfinite(r.losses[r.onset]) and all(math.isfinite(v) for v in r.losses[:r.onset])
    elif injection == "inputs_rescaled":
        healthy = eco.run(arch, "healthy", seed=3, steps=STEPS, threads=1)
        assert r.losses[:r.onset] == healthy.losses[:r.onset]  # same data before the onset
        assert _mean(r.losses[r.onset:r.onset + 5]) > _mean(healthy.losses[r.onset:r.onset + 5]) + 0.5
    else:
        assert r.onset == 0 and r.layer is None


def test_t5_norm_layers_are_read_by_role_and_shuffled_targets_do_not_apply():
    """T5's ``T5LayerNorm`` (no torch norm class) counts as normalization; its decoder learns the
    target chain from its own prefix, so shuffled target rows are a fault without effect."""
    pytest.importorskip("transformers")
    from neuraldbg.causal import api

    r = eco.run("hf_t5", "healthy", seed=0, steps=STEPS, monitor=True, threads=1)
    assert {li.role for li in r.dbg.trace().layers if li.type == "T5LayerNorm"} == {"norm"}
    assert api.evidence(r.dbg.trace()).observed["depth_risk"] == "low"
    with pytest.raises(ValueError, match="valid: healthy"):
        eco.run("hf_t5", "labels_shuffled")


def test_config_faults_on_a_token_model():
    pytest.importorskip("transformers")
    r = eco.run("hf_gpt2", "weights_x1e-3", seed=0, steps=4, threads=1)
    assert r.truth == ("initialization", "too_small") and r.layer == "transformer.wte"
    assert r.losses[0] == pytest.approx(math.log(64), abs=0.05)  # tiny weights: uniform output


@pytest.mark.parametrize("injection,state", [
    ("zero_grad_missing", "stale_gradients"), ("optimizer_misses_layer", "params_not_in_optimizer"),
    ("layer_detached", "graph_detached"), ("softmax_before_ce", "loss_on_probabilities"),
])
def test_loop_faults_do_what_they_say_and_are_named(injection, state):
    """The loop bugs on a PyG model (seed 3: bf16 autocast and 2-micro-batch accumulation, so
    accumulation inside the recipe stays legitimate): each edit has its effect on the run, and
    the monitor, handed no optimizer, names the state."""
    pytest.importorskip("torch_geometric")
    r = eco.run("pyg_gcn", injection, seed=3, steps=STEPS, monitor=True, threads=1)
    assert r.truth == ("training_loop", state) and r.dbg.optimizer is not None  # found
    layer = r.dbg.model.get_submodule("convs.0.lin")
    if injection == "optimizer_misses_layer":
        assert all(p.grad is not None for p in layer.parameters())  # gradients, never applied
    if injection == "layer_detached":
        assert all(p.grad is None for p in layer.parameters())  # no gradient through the cut
    top = r.dbg.get_causal_hypotheses()[0]
    assert (top.cause, top.state) == ("training_loop", state)
    assert r.dbg.posterior().p_healthy < 0.5


def test_a_tabular_column_in_other_units_from_the_onset():
    r = eco.run("torch_tabular", "feature_units", seed=0, steps=STEPS, threads=1)
    healthy = eco.run("torch_tabular", "healthy", seed=0, steps=STEPS, threads=1)
    assert r.truth == ("data", "shifted") and r.layer == "0" and r.onset == round(0.4 * STEPS)
    assert r.losses[:r.onset] == healthy.losses[:r.onset]  # same rows before the onset
    assert _mean(r.losses[r.onset:]) > _mean(healthy.losses[r.onset:]) + 0.5
    task = eco.get_arch("torch_tabular").build(Build(seed=0))
    bt = task.batch(8)
    out = eco.FAULTS["feature_units"].batch(bt, task, None)["x"]
    cols = [i for i in range(out.shape[1]) if not torch.equal(out[:, i], bt["x"][:, i])]
    assert cols == [2] and torch.allclose(out[:, 2], 1000 * bt["x"][:, 2])


def test_raw_pixels_from_step_0_harm_the_diffusion_model():
    pytest.importorskip("diffusers")
    r = eco.run("diffusers_unet", "raw_pixels", seed=0, steps=24, threads=1)  # the gap shows from ~20 steps
    healthy = eco.run("diffusers_unet", "healthy", seed=0, steps=24, threads=1)
    assert r.truth == ("data", "shifted") and r.onset == 0 and r.layer == "conv_in"
    assert _mean(r.losses[-10:]) > 2 * _mean(healthy.losses[-10:])


def test_a_config_initializer_range_x100_blows_the_first_loss_up():
    pytest.importorskip("transformers")
    r = eco.run("hf_bert", "config_range_x100", seed=0, steps=2, threads=1)
    assert r.truth == ("initialization", "too_large")
    assert r.losses[0] > 3 * math.log(4)  # a 4-way classifier at init starts near ln 4

def test_no_warmup_starts_at_the_peak_rate_where_its_twin_ramps_up():
    from neuraldbg.causal.nodes.run import LR_PEAK
    from neuraldbg.causal.nodes.schedule import LR_FIRST

    assert [i.name for i in eco.injections("torch_encoder_deep")] == ["healthy", "lr_x100", "lr_div1e4",
                                                                      "no_warmup"]
    assert "lr_div100" in [i.name for i in eco.injections("hf_bert")]
    first = {}
    for inj in ("healthy", "no_warmup"):
        r = eco.run("torch_encoder_deep", inj, seed=0, steps=20, monitor=True, threads=1)
        sigs = r.dbg.trace().signatures
        first[inj] = sigs.number(LR_FIRST) / sigs.number(LR_PEAK)
    assert first == {"healthy": 0.5, "no_warmup": 1.0}  # a 2-step ramp on 20 steps; none


def test_schedule_faults_apply_to_the_plain_torch_archs_with_their_onsets():
    from benchmarks.ecosystem import schedules as eco_schedules
    from neuraldbg.causal.nodes.optimizer_state import OPTIMIZER_STATE_STEPS
    from neuraldbg.causal.nodes.schedule import LR_COLLAPSE_STEP, LR_FIRST

    schedules = {"scheduler_per_batch", "schedule_linear_to_zero", "schedule_warm_restarts"}
    resumes = {"resume_without_state", "resume_with_state"}
    for arch in eco.architectures():
        names = {i.name for i in eco.injections(arch)}
        assert (schedules <= names) == (arch in ("torch_tabular", "torch_encoder"))
        assert (resumes <= names) == (arch == "torch_encoder") and (resumes & names in (set(), resumes))
    inj = {i.name: i for i in eco.injections("torch_encoder", steps=STEPS)}
    assert inj["scheduler_per_batch"].onset == 9 and inj["scheduler_per_batch"].truth == ("learning_rate", "too_low")
    assert inj["resume_without_state"].onset == 0 and inj["resume_with_state"].truth is None
    sigs = eco.run("torch_tabular", "scheduler_per_batch", seed=0, steps=STEPS, monitor=True,
                   threads=1).dbg.trace().signatures
    assert sigs.number(LR_COLLAPSE_STEP) == 9                                  # 3 x step_size 3
    sigs = {n: eco.run("torch_encoder", n, seed=0, steps=STEPS, monitor=True, threads=1).dbg.trace().signatures
            for n in resumes}
    assert sigs["resume_without_state"].number(OPTIMIZER_STATE_STEPS) == 0     # a fresh AdamW
    # its state restored: the steps of the pre-training (three runs' lengths)
    assert sigs["resume_with_state"].number(OPTIMIZER_STATE_STEPS) == int(STEPS * eco_schedules.PRETRAIN_FRAC)
    # resumed at the schedule's peak (10x the recipe's 1e-3), or where the pre-training's schedule
    # stopped (three quarters through the cosine over all four lengths: 0.15 of the peak)
    assert abs(sigs["resume_without_state"].number(LR_FIRST) - 1e-2) < 1e-12
    assert sigs["resume_with_state"].number(LR_FIRST) < 0.2 * 1e-2
