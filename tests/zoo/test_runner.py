"""The registry, the runner's contract (docs/api.md) and its monitor plumbing, with a fake monitor."""
from __future__ import annotations

import pytest
import torch

import models
from models.injections import LABEL_FAULTS, LOOP_ARCHS, Injection, register_injection
from neuraldbg.vocab import ROOTS
from zoo_testing import cached_run

EXPECTED = {"mlp", "cnn", "transformer", "dcgan", "lora", "diffusion", "lstm", "gnn", "gat",
            "rl", "compiled", "dataparallel"}
FAMILY = {"dcgan": "gan", "lstm": "rnn", "gat": "gnn", "compiled": "mlp", "dataparallel": "mlp"}
GENERAL = {"healthy", "lr_too_high", "lr_too_low", "init_too_small", "init_too_large",
           "data_nan", "data_inf", "data_shift", "arch_unstable"}


def test_architectures_and_families():
    assert set(models.architectures()) == EXPECTED
    covered = {models.family(a) for a in models.architectures()}
    assert covered == set(models.FAMILIES)  # every family has an architecture
    for a in models.architectures():
        assert models.family(a) == FAMILY.get(a, a)


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_injections_are_bound_and_well_formed(arch):
    injs = models.injections(arch)
    names = [i.name for i in injs]
    assert names[0] == "healthy" and injs[0].truth is None and injs[0].onset is None
    assert len(names) == len(set(names))
    steps = models.get_arch(arch).config().steps
    for i in injs[1:]:
        var, state = i.truth
        assert state in ROOTS[var] and state != "ok"
        assert i.arch == arch and isinstance(i.onset, int) and 0 <= i.onset < steps
        assert i.layer is None or isinstance(i.layer, str)
        assert i.description and i.why
        if i.name.startswith("data_"):  # data faults enter at a named layer, mid-run
            assert i.layer and i.onset > 0
    # a fault per root-cause variable (LoRA's frozen base leaves no architecture fault; the
    # loop bugs are injected where a loop of that kind can have them, the leak wherever a
    # stall outside the network can be built; numbers that leave their precision by the
    # diffusion model's in-network NaN, and by the ecosystem suite, whose recipes choose dtypes
    # and optimizers as users do)
    expected = set(ROOTS) - ({"numerics"} if arch != "diffusion" else set()) \
        - ({"architecture"} if arch == "lora" else set())
    if arch not in LOOP_ARCHS + ("lora",):
        expected -= {"training_loop"}
    if arch not in ("cnn", "mlp"):
        expected -= {"unexplained"}
    assert {i.truth[0] for i in injs[1:]} == expected


def test_general_injections_cover_the_mlp_family():
    loop = {"zero_grad_missing", "optimizer_misses_layer", "layer_detached", "softmax_before_ce"}
    for arch in ("compiled", "dataparallel"):
        assert set(models.injection_names(arch)) == GENERAL | set(LABEL_FAULTS)
    assert set(models.injection_names("mlp")) == GENERAL | set(LABEL_FAULTS) | loop | {"regression_on_class_ids"}
    assert set(models.injection_names("cnn")) == (GENERAL | set(LABEL_FAULTS) | loop
                                                  | {"bottleneck_width1", "regression_on_class_ids"})


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_truth_layers_name_real_modules(arch):
    r = cached_run(arch, "healthy", 0, 1)  # a one-step run is enough to build the model
    spec = models.get_arch(arch)
    trainer = spec.trainer(spec.config(), 0, models.get_injection(arch, "healthy").bind(spec))
    net = getattr(trainer.model, "module", trainer.model)  # DataParallel: the inner names
    names = dict(net.named_modules())
    for i in models.injections(arch):
        if i.layer is not None:
            assert i.layer in names, f"{arch}/{i.name}: {i.layer} is not a module"
    assert r.steps == 1


def test_unknown_names_raise_with_the_valid_ones():
    with pytest.raises(ValueError, match="valid: .*mlp.*rl"):
        models.run("resnet", "healthy", 0)
    with pytest.raises(ValueError, match="valid: healthy, lr_too_high"):
        models.run("mlp", "bogus", 0)
    with pytest.raises(ValueError, match="unknown injection 'nan_softmax' for 'mlp'"):
        models.run("mlp", "nan_softmax", 0)
    with pytest.raises(ValueError):
        models.injections("resnet")
    with pytest.raises(ValueError):
        models.run("mlp", "healthy", 0, steps=0)


def test_run_accepts_an_injection_object_and_scales_the_onset():
    inj = next(i for i in models.injections("mlp") if i.name == "data_nan")
    r = models.run("mlp", inj, 0, steps=50)
    assert r.injection == "data_nan" and r.truth == ("data", "corrupted")
    assert r.onset == round(models.ONSET_FRAC * 50) == r.first_nonfinite_step
    assert r.layer == "blocks.0.fc" and r.steps == len(r.losses) == 50
    gnn_inj = models.injections("gnn")[1]
    with pytest.raises(ValueError, match="does not apply"):
        models.run("rl", models.get_injection("gnn", "data_shift"), 0)
    assert gnn_inj.arch == "gnn"


def test_run_result_extras():
    r = cached_run("rl", "healthy", 0)
    assert r.arch == "rl" and r.family == "rl" and r.seed == 0
    assert r.progress == ("episode_return", "up")
    df = r.frame()
    assert list(df.columns[:2]) == ["step", "loss"] and len(df) == r.steps
    assert {"entropy", "episode_return"} <= set(df.columns)
    assert 0 < r.first_step_time <= r.wall_time


def test_runs_leave_global_state_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    threads = torch.get_num_threads()
    models.run("mlp", "healthy", 5, steps=5, threads=2)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.get_num_threads() == threads


def test_register_injection_rejects_clashes_and_bad_truths():
    with pytest.raises(ValueError, match="already registered"):
        register_injection(Injection(name="data_nan", archs=("mlp", "zzz"), truth=("data", "corrupted"),
                                     description="dup"))
    with pytest.raises(ValueError, match="not a fault"):
        Injection(name="x", archs=("mlp",), truth=("data", "ok"), description="")
    with pytest.raises(ValueError, match="not a fault"):
        Injection(name="x", archs=("mlp",), truth=("optimizer", "broken"), description="")


def test_a_one_shot_fault_fires_once_per_run():
    a = models.run("mlp", "data_nan", 0, steps=30)
    b = models.run("mlp", "data_nan", 0, steps=30)  # fresh state per run
    assert a.onset == b.onset == 12 and a.losses[:12] == b.losses[:12]


# ---------------------------------------------------------------------------- monitor plumbing


class FakeDbg:
    """Records what the runner does with a monitor, and checks the call order."""

    instances: list["FakeDbg"] = []

    def __init__(self, model, family=None, optimizer=None, every=1, **kw):
        self.model, self.family, self.optimizer, self.every, self.kw = model, family, optimizer, every, kw
        self.steps, self.losses, self.entered, self.exited = [], [], False, False
        self.forward_calls = 0
        self.grads_at_record = []
        leaves = [m for m in model.modules() if not list(m.children())]  # as NeuralDbg does
        self.handles = [m.register_forward_hook(self._hook) for m in leaves]
        FakeDbg.instances.append(self)

    def _hook(self, mod, inp, out):
        self.forward_calls += 1

    def addon(self, cls):
        return None  # no snapshots, no other parts

    def __enter__(self):
        self.entered = True
        return self

    def __exit__(self, *exc):
        self.exited = True
        for h in self.handles:
            h.remove()
        return False

    def record_loss(self, loss):
        assert isinstance(loss, torch.Tensor) and loss.dim() == 0
        self.losses.append(float(loss.detach()))
        self.steps.append(self.step)
        # gradients are there (after backward) and the optimizer has not stepped yet
        p = next(p for p in self.model.parameters() if p.grad is not None)
        self.grads_at_record.append(p.grad.detach().clone())
        self.param_at_record = p.detach().clone()
        self.param = p


@pytest.fixture
def fake_monitor(monkeypatch):
    import neuraldbg

    FakeDbg.instances = []
    monkeypatch.setattr(neuraldbg, "NeuralDbg", FakeDbg, raising=False)
    return FakeDbg


@pytest.mark.parametrize("arch", ["mlp", "dcgan", "lora", "rl", "compiled", "dataparallel"])
def test_monitor_wraps_training(fake_monitor, arch):
    bare = models.run(arch, "healthy", 0, steps=6, config={"backend": "aot_eager"} if arch == "compiled" else None)
    r = models.run(arch, "healthy", 0, steps=6, monitor=True,
                   config={"backend": "aot_eager"} if arch == "compiled" else None)
    dbg = r.dbg
    assert isinstance(dbg, FakeDbg) and dbg.entered and dbg.exited
    assert dbg.family == models.family(arch)
    assert dbg.optimizer is None  # found by the monitor, as for a user who passes none
    assert dbg.steps == list(range(6))
    assert dbg.losses == pytest.approx(r.losses, nan_ok=True)
    assert r.losses == bare.losses  # a passive monitor changes nothing
    assert dbg.forward_calls >= 6  # leaf hooks registered by the monitor see every step


def test_the_optimizer_is_handed_over_only_with_snapshots(fake_monitor):
    """The first snapshot is taken before any optimizer stepped: it needs the optimizer given."""
    r = models.run("mlp", "healthy", 0, steps=2, monitor={"snapshots": True})
    assert r.dbg.optimizer is not None and r.dbg.kw["snapshots"] is True


def test_monitor_dict_overrides_family_and_passes_kwargs(fake_monitor):
    r = models.run("mlp", "healthy", 0, steps=3, monitor={"family": "cnn", "every": 4})
    assert r.dbg.family == "cnn" and r.dbg.every == 4
    assert models.run("mlp", "healthy", 0, steps=3, monitor=False).dbg is None


def test_record_loss_comes_after_backward_and_before_the_update(fake_monitor):
    r = models.run("mlp", "healthy", 0, steps=2, monitor=True)
    dbg = r.dbg
    assert all(g.abs().sum() > 0 for g in dbg.grads_at_record)
    assert not torch.equal(dbg.param_at_record, dbg.param.detach())  # stepped afterwards
