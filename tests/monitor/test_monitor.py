"""The monitor: never changes training, never raises into it, removes every hook."""
import logging
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.monitor import stats as S
from tests.tiny import batches, run, spy_steps


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(inplace=True), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def train(model, steps=50, dbg_kwargs=None, seed=0):
    r = run(model, steps=steps, monitor=dbg_kwargs, optimizer=torch.optim.Adam, lr=1e-2, data=batches(steps, seed=seed))
    return r.losses, r.dbg


def hook_state(model):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
             len(getattr(m, "_backward_pre_hooks", {}))) for m in model.modules()] + \
           [len(p._post_accumulate_grad_hooks or {}) if hasattr(p, "_post_accumulate_grad_hooks") else 0
            for p in model.parameters()]


@pytest.mark.parametrize("kwargs", [{}, {"every": 10}, {"optimizer": True},
                                    {"optimizer": True, "every": 3}])
def test_training_is_bitwise_identical_with_and_without_monitor(kwargs):
    m1, m2 = mlp(), mlp()
    l1, _ = train(m1)
    l2, dbg = train(m2, dbg_kwargs=kwargs)
    assert all(torch.equal(a, b) for a, b in zip(l1, l2))
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    assert dbg.events == []  # a healthy 50-step run
    if "optimizer" in kwargs:  # the step-size probe measured, then left the optimizer as it was
        opt = dbg.optimizer
        from neuraldbg.monitor.measurements.step_size import StepSize as StepSizeProbe

        checked = len(range(0, 50, kwargs.get("every", 1)))
        assert dbg.signatures().as_dict()["step_ratio_steps"] == min(checked, StepSizeProbe.WINDOW)
        assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_hooks_removed_on_exit_also_when_body_raises():
    m = mlp()
    before = hook_state(m)
    with pytest.raises(RuntimeError, match="user error"):
        with NeuralDbg(m):
            m(torch.randn(2, 8)).sum().backward()
            assert hook_state(m) != before
            raise RuntimeError("user error")
    assert hook_state(m) == before
    for p in m.parameters():
        assert not getattr(p, "_post_accumulate_grad_hooks", None)


class Odd(nn.Module):
    """Returns whatever it is told to: the monitor must skip what it cannot measure."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return {"tuple": lambda: (h, h.detach()), "dict": lambda: {"h": h}, "none": lambda: None,
                "int": lambda: torch.ones(3, dtype=torch.long), "sparse": lambda: h.detach().to_sparse(),
                "empty": lambda: h[:0]}[self.kind]()


class Leaf(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, h):
        return {"tuple": (h, h.detach()), "dict": {"h": h}, "none": None,
                "int": torch.ones(3, dtype=torch.long), "sparse": h.detach().to_sparse(), "empty": h[:0]}[self.kind]


@pytest.mark.parametrize("kind", ["tuple", "dict", "none", "int", "sparse", "empty"])
def test_odd_outputs_are_skipped_without_raising(kind, caplog):
    lin = nn.Linear(4, 4)
    leaf = Leaf(kind)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.leaf = lin, leaf

        def forward(self, x):
            h = self.lin(x)
            self.leaf(h)
            return h.sum()

    net = Net()
    with caplog.at_level(logging.INFO, logger="neuraldbg"):
        with NeuralDbg(net, family="mlp") as dbg:
            for _ in range(3):
                net(torch.randn(2, 4)).backward()
                dbg.record_loss(1.0)
    msgs = [r for r in caplog.records if "leaf" in r.getMessage()]
    if kind != "tuple":  # a tuple's first tensor is measured (LSTM-style outputs)
        assert len(msgs) == 1, "logged once, not once per call"
    assert dbg.trace().layers  # still monitoring the other layers


def test_internal_failure_is_logged_once_and_never_raises(monkeypatch, caplog):
    def boom(*a, **k):
        raise RuntimeError("stat exploded")

    monkeypatch.setattr(S, "output_stats", boom)
    m = mlp()
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        losses, dbg = train(m, steps=5, dbg_kwargs={})
    failures = [r for r in caplog.records if "stat exploded" in r.getMessage()]
    assert 1 <= len(failures) <= len(list(m.modules()))  # at most once per module
    assert len(losses) == 5


def test_detector_failure_degrades(monkeypatch, caplog):
    from neuraldbg.events import gradient

    monkeypatch.setattr(gradient.GradientHealthDetector, "update", lambda self, s: 1 / 0)
    with caplog.at_level(logging.WARNING, logger="neuraldbg"):
        _, dbg = train(mlp(), steps=5, dbg_kwargs={})
        assert dbg.events == []
    assert sum("detector gradient failed" in r.getMessage() for r in caplog.records) == 1


def test_record_loss_rejects_bad_input():
    with NeuralDbg(mlp()) as dbg:
        with pytest.raises(TypeError, match="float or a 0-d tensor"):
            dbg.record_loss("1.0")
        with pytest.raises(ValueError, match="scalar"):
            dbg.record_loss(torch.ones(3))


def test_bad_arguments_name_valid_values():
    with pytest.raises(ValueError, match="every"):
        NeuralDbg(mlp(), every=0)
    with pytest.raises(ValueError, match="valid: mlp"):
        NeuralDbg(mlp(), family="resnet")
    with pytest.raises(TypeError, match="nn.Module"):
        NeuralDbg(lambda x: x)
    with pytest.raises(ValueError, match="valid"):
        NeuralDbg(mlp(), config={"no_such_threshold": 1})


def test_step_advances_and_user_steps():
    m = mlp()
    with NeuralDbg(m) as dbg:
        for _ in range(3):
            m(torch.randn(2, 8)).sum().backward()
            dbg.record_loss(1.0)
        assert dbg.step == 3
    tr = dbg.trace()
    assert (tr.first_step, tr.last_step, tr.loss.n) == (0, 2, 3)
    m = mlp()
    with NeuralDbg(m) as dbg:
        for s in (10, 20):
            dbg.step = s
            m(torch.randn(2, 8)).sum().backward()
            dbg.record_loss(torch.tensor(1.0))
            dbg.record_loss(torch.tensor(3.0))  # averaged within a step
    tr = dbg.trace()
    assert (tr.first_step, tr.last_step) == (10, 20)
    assert [v for _, v in tr.loss.history] == [2.0, 2.0]


def test_every_n_checks_only_every_nth_step(monkeypatch):
    seen = []
    orig = NeuralDbg._consume

    def spy(self, st):
        seen.append((st.step, bool(st.layers), st.loss))
        return orig(self, st)

    monkeypatch.setattr(NeuralDbg, "_consume", spy)
    train(mlp(), steps=25, dbg_kwargs={"every": 10})
    assert [s for s, has, _ in seen if has] == [0, 10, 20]
    # the loss of every step is still recorded, in order, unchecked ones too
    assert [s for s, _, _ in seen] == list(range(25))
    assert all(isinstance(v, float) and math.isfinite(v) for _, _, v in seen)


def test_eval_steps_record_no_gradient_statistics(monkeypatch):
    seen = spy_steps(monkeypatch)
    m = mlp()
    with NeuralDbg(m) as dbg:
        dbg.step = 0
        with torch.no_grad():
            m(torch.randn(4, 8))
        dbg.record_loss(0.5)
        dbg.step = 1
        m(torch.randn(4, 8)).sum().backward()
        dbg.record_loss(0.5)
    assert not seen[0].has_backward and not seen[0].layers  # no_grad forward: nothing measured
    assert seen[1].has_backward and all("pgrad_n" in d for k, d in seen[1].layers.items() if k in ("0", "2", "4"))


def test_shared_module_frozen_params_and_inplace():
    torch.manual_seed(0)
    shared = nn.Linear(8, 8)
    frozen = nn.Linear(8, 3)
    frozen.weight.requires_grad_(False)
    net = nn.ModuleDict({"shared": shared, "act": nn.ReLU(inplace=True), "out": frozen})

    def fwd(x):
        return net["out"](net["act"](net["shared"](net["act"](net["shared"](x)))))

    with NeuralDbg(net, family="mlp") as dbg:
        for _ in range(8):
            fwd(torch.randn(4, 8)).pow(2).mean().backward()
            dbg.record_loss(1.0)
    names = [l.name for l in dbg.trace().layers]
    assert names[:3] == ["shared", "act", "out"]
    assert dbg.events == []


def test_dataparallel_on_cpu_reports_every_layer(monkeypatch):
    seen = spy_steps(monkeypatch)
    m = mlp()
    dp = nn.DataParallel(m)
    train(dp, steps=3, dbg_kwargs={})
    assert set(seen[-1].layers) == {"0", "1", "2", "3", "4"}
    assert all("pgrad_n" in seen[-1].layers[k] for k in ("0", "2", "4"))


def test_torch_compile_works_without_recompiles_after_first_steps():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    m = mlp()
    dbg = NeuralDbg(m, every=2)  # hooks go on the eager modules, before compiling
    cm = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    graphs = []
    with dbg:
        for _ in range(12):
            x = torch.randn(16, 8, generator=gen)
            loss = F.cross_entropy(cm(x), torch.randint(0, 3, (16,), generator=gen))
            opt.zero_grad()
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[3] == graphs[-1], f"recompiled after the first steps: {graphs}"
    tr = dbg.trace()
    assert {l.name for l in tr.layers} >= {"0", "2", "4"}
    assert tr.loss.n == 12


def test_compiled_graph_of_an_unhooked_instance_is_not_reused():
    """Regression: with an instance of the same class compiled earlier in the process, dynamo
    reused its graph (no hook guards) for the monitored instance and no hook ever fired."""
    torch._dynamo.config.skip_nnmodule_hook_guards = True  # torch's default
    first = torch.compile(mlp(), backend="aot_eager")
    first(torch.randn(4, 8)).sum().backward()
    m = mlp(1)
    dbg = NeuralDbg(m)
    cm = torch.compile(m, backend="aot_eager")
    with dbg:
        for _ in range(3):
            cm(torch.randn(4, 8)).sum().backward()
            dbg.record_loss(1.0)
    assert dbg._hooks.order[:5] == ["0", "1", "2", "3", "4"], "forward hooks fired under the compiled graph"
