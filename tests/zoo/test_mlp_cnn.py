"""mlp, cnn, compiled, dataparallel: models, data makers and wrappers."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import models
from models.cnn import CNN, CNNConfig, make_shapes
from models.mlp import MLP, MLPConfig, TeacherData
from zoo_testing import cached_run


def test_mlp_shapes_and_unstable_variant():
    cfg = MLPConfig()
    assert MLP(cfg)(torch.randn(5, cfg.in_dim)).shape == (5, cfg.n_classes)
    deep = MLP(MLPConfig(unstable=True))
    assert len(deep.blocks) == 16 and all(isinstance(b.act, nn.Sigmoid) for b in deep.blocks)


def test_teacher_labels_use_every_class_and_are_seeded():
    a, b = TeacherData(MLPConfig(), 0), TeacherData(MLPConfig(), 0)
    xa, ya = a.batch(0, n=2000)
    xb, yb = b.batch(0, n=2000)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    counts = torch.bincount(ya, minlength=4)
    assert (counts > 100).all(), counts  # no degenerate class


def test_make_shapes():
    g = torch.Generator().manual_seed(0)
    x, y = make_shapes(400, 16, g)
    assert x.shape == (400, 1, 16, 16) and x.min() == -1 and x.max() == 1
    assert set(y.tolist()) == {0, 1, 2, 3}
    fg = (x > 0).float().mean((1, 2, 3))
    assert (fg > 0.02).all() and (fg < 0.6).all()  # every image has a shape, none fills it
    # squares fill more of their box than pluses: the classes differ visibly
    assert fg[y == 0].mean() > fg[y == 2].mean()


def test_cnn_shapes_and_unstable_variant():
    assert CNN(CNNConfig())(torch.randn(2, 1, 16, 16)).shape == (2, 4)
    assert len(CNN(CNNConfig(unstable=True)).blocks) == 14


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_healthy_classifiers_generalise(arch):
    assert cached_run(arch, "healthy", 0).metrics["test_accuracy"] > 0.7


@pytest.mark.parametrize("arch", ["compiled", "dataparallel"])
def test_wrapped_mlps_match_the_eager_mlp(arch):
    r, eager = cached_run(arch, "healthy", 0), cached_run("mlp", "healthy", 0)
    assert r.family == "mlp"
    assert r.losses == pytest.approx(eager.losses, rel=1e-4, abs=1e-5)
    for inj in ("data_nan", "lr_too_high"):
        a, b = cached_run(arch, inj, 0), cached_run("mlp", inj, 0)
        assert a.first_nonfinite_step == b.first_nonfinite_step and a.truth == b.truth


def test_dataparallel_trains_the_wrapper():
    spec = models.get_arch("dataparallel")
    t = spec.trainer(spec.config(), 0, models.get_injection("dataparallel", "healthy").bind(spec))
    assert isinstance(t.model, nn.DataParallel) and t.model.module is t.net


def test_compiled_hooks_registered_before_compile_fire():
    """What NeuralDbg relies on: hooks put on the eager model, then compiled, still run,
    even after an earlier run compiled another instance of the class without hooks."""
    cached_run("compiled", "healthy", 0, 3)  # an earlier, hook-free compile of MLP
    spec = models.get_arch("compiled")
    cfg = spec.config(backend="aot_eager", steps=3)
    t = spec.trainer(cfg, 0, models.get_injection("compiled", "healthy").bind(spec))
    seen = []
    t.model.blocks[0].fc.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    t.start()
    assert t.forward is not t.model  # training runs the compiled module
    for step in range(3):
        t.forward_backward(step)
        t.optimizer_step(step)
    assert len(seen) == 3


@pytest.mark.slow
def test_compiled_with_inductor_learns_like_eager():
    r = models.run("compiled", "healthy", 0)  # the default backend: inductor
    eager = cached_run("mlp", "healthy", 0)
    assert r.losses == pytest.approx(eager.losses, rel=1e-3, abs=1e-4)
