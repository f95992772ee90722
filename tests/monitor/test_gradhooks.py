"""How backward passes are noticed (neuraldbg/monitor/gradhooks.py): the model output's gradient
by default, parameter hooks where the output cannot see every pass; both read the same gradients."""
import logging

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.config import DetectorConfig
from neuraldbg.monitor.gradhooks import MAX_OUTPUT_HOOKS, _grad_tensors
from tests.monitor.measurements.test_loop import GAN
from tests.monitor.test_hooks import micro_batch_run, stack, stack_run, train_steps


def monitored(model, every=1, **config):
    """A monitor on ``model`` under ``DetectorConfig(**config)`` (not entered) and the list its
    steps' statistics are appended to."""
    seen = []
    dbg = NeuralDbg(model, every=every, config=DetectorConfig(**config))
    orig = dbg._consume
    dbg._transfer._consume = lambda st: (seen.append(st), orig(st))
    return dbg, seen


def classify(model, dbg, steps, call=None):
    """Train ``model`` ``steps`` steps under ``dbg`` (entered here) with SGD on a fixed stream:
    each row's class is the largest of its first three inputs; ``call`` runs the forward."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    call = model if call is None else call
    with dbg:
        train_steps(call, opt, dbg, steps, gen, batch=8)
    return dbg


def _same_gradients(got, want, n_layers):
    assert [st.step for st in got] == [st.step for st in want] and len(got) >= 3
    for a, b in zip(got, want):
        assert (a.has_pgrad == b.has_pgrad).all() and a.has_pgrad.sum() == n_layers
        assert (a.cols["pgrad_n"] == b.cols["pgrad_n"]).all()
        assert a.cols["pgrad_sumsq"] == pytest.approx(b.cols["pgrad_sumsq"], rel=1e-6, nan_ok=True)


def _hooked(model):
    """Parameters that torch holds a post-accumulate-grad hook object for (dict set, even empty)."""
    return sum(p._post_accumulate_grad_hooks is not None for p in model.parameters())


@pytest.mark.parametrize("every", [1, 3])
def test_the_output_s_gradient_reads_what_parameter_hooks_read_and_leaves_nothing_in_torch(every):
    """Regression: every hooked parameter kept a C++ hook object calling into Python on every
    backward pass, after the monitor exited too. The output route registers none."""
    hooks, want, n_hooks = stack_run(10, 7, every, param_grad_hooks=True)
    out, got, n_out = stack_run(10, 7, every)
    assert out._hooks.output_grads and not hooks._hooks.output_grads
    assert n_hooks == 22 and n_out == 0
    _same_gradients(got, want, 11)
    assert [repr(e) for e in out.events] == [repr(e) for e in hooks.events]
    assert out._hooks.watched == {} and out._hooks._nodes is None  # exit drops the parameters held


def test_no_parameter_hook_object_is_left_after_the_monitor_exits():
    model = stack(4)
    classify(model, NeuralDbg(model, every=2), 4)
    assert _hooked(model) == 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_accumulated_micro_batches_read_as_with_parameter_hooks():
    """Two backward passes per step (``dbg.step`` set): each pass is read when it ends, the last
    pass's reading is the step's."""
    hooks, want = micro_batch_run(8, param_grad_hooks=True)
    out, got = micro_batch_run(8)
    assert out._hooks.output_grads
    _same_gradients(got, want, 11)


def _gan_run(**config):
    m = GAN()
    opt_g = torch.optim.Adam(m.G.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(m.D.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    ones, zeros = torch.ones(16, 1), torch.zeros(16, 1)
    dbg, seen = monitored(m, every=2, **config)
    with dbg:
        for _ in range(8):
            real = torch.randn(16, 2, generator=gen) + 2.0
            fake = m.G(torch.randn(16, 4, generator=gen))
            opt_d.zero_grad()
            d_loss = (F.binary_cross_entropy_with_logits(m.D(real), ones)
                      + F.binary_cross_entropy_with_logits(m.D(fake.detach()), zeros))
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss = F.binary_cross_entropy_with_logits(m.D(fake), ones)
            g_loss.backward()
            opt_g.step()
            dbg.record_loss(d_loss + g_loss)
    return dbg, [st for st in seen if st.names]


def test_a_loop_that_calls_sub_networks_switches_to_parameter_hooks_before_its_first_backward(caplog):
    """The root's forward never runs, so its output sees no pass: the first layer called outside
    it switches to parameter hooks, in time for the first checked step's gradients."""
    hooks, want = _gan_run(param_grad_hooks=True)
    with caplog.at_level(logging.INFO, logger="neuraldbg"):
        out, got = _gan_run()
    assert not out._hooks.output_grads
    assert "outside the model's forward" in caplog.text
    assert got[0].step == 0 and got[0].has_pgrad.sum() == 4  # the first check reads every layer
    _same_gradients(got, want, 4)


class Stash(nn.Module):
    """Its forward keeps an intermediate that the loop's loss is computed from."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        self.logits = self.body(x)
        return self.logits.detach().argmax(dim=1)  # what the loop logs: no gradient through it


def test_an_output_without_a_gradient_switches_to_parameter_hooks_before_the_backward(caplog):
    model = Stash()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dbg, seen = monitored(model, every=1)
    gen = torch.Generator().manual_seed(0)
    with caplog.at_level(logging.INFO, logger="neuraldbg"), dbg:
        for _ in range(5):
            x = torch.randn(8, 8, generator=gen)
            opt.zero_grad()
            model(x)
            loss = F.cross_entropy(model.logits, x[:, :3].argmax(dim=1))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert not dbg._hooks.output_grads
    assert "holds no tensor that requires a gradient" in caplog.text
    checked = [st for st in seen if st.names]
    assert len(checked) == 5 and all(st.has_pgrad.sum() == 2 for st in checked)  # the first step's too


def test_an_output_hooked_but_never_reached_switches_at_the_optimizer_step(caplog):
    """The output requires a gradient, yet the loss comes from a stashed intermediate."""
    class Aux(Stash):
        def forward(self, x):
            self.logits = self.body(x)
            return self.logits * 1.0

    model = Aux()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with caplog.at_level(logging.INFO, logger="neuraldbg"), NeuralDbg(model, every=1) as dbg:
        for _ in range(3):
            x = torch.randn(8, 8)
            opt.zero_grad()
            model(x)
            F.cross_entropy(model.logits, x[:, :3].argmax(dim=1)).backward()
            assert dbg._hooks.output_grads or _hooked(model) == 4
            opt.step()
            dbg.record_loss(0.0)
    assert not dbg._hooks.output_grads and _hooked(model) == 4
    assert "no backward pass went through the model's output" in caplog.text


def test_a_gradient_penalty_through_the_output_is_not_read_as_a_backward_pass():
    """``torch.autograd.grad`` accumulates no parameter gradient: it opens no pass, so the loop's
    check sees exactly the passes parameter hooks see."""
    def run_(**config):
        model = stack(3)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(0)
        starts = []
        dbg = NeuralDbg(model, every=1, config=DetectorConfig(**config))
        dbg._hooks.backward_started = lambda p, f=dbg._hooks.backward_started: (starts.append(p), f(p))
        with dbg:
            for _ in range(6):
                x = torch.randn(8, 8, generator=gen, requires_grad=True)
                opt.zero_grad()
                out = model(x)
                (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
                loss = F.cross_entropy(out, x[:, :3].argmax(dim=1)) + 0.1 * g.pow(2).mean()
                loss.backward()
                dbg.record_loss(loss)
                opt.step()
        return dbg, starts

    hooks, hook_starts = run_(param_grad_hooks=True)
    out, out_starts = run_()
    assert out._hooks.output_grads and len(out_starts) == len(hook_starts) == 6
    assert out.trace().signatures.as_dict() == hooks.trace().signatures.as_dict()
    assert not out.events and not hooks.events


def test_parameters_with_post_accumulate_hooks_of_their_own_get_parameter_hooks(caplog):
    """An optimizer run in backward consumes each gradient in its own hook: read before it."""
    model = stack(2)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: None)
    with caplog.at_level(logging.INFO, logger="neuraldbg"), NeuralDbg(model) as dbg:
        assert not dbg._hooks.output_grads
    assert "post-accumulate-grad hooks of their own" in caplog.text


class Dict(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x, y):
        logits = self.body(x)
        return {"loss": F.cross_entropy(logits, y), "logits": logits, "hidden": (logits * 2,)}


def test_a_model_output_mapping_is_hooked_through_its_tensors():
    model = Dict()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dbg, seen = monitored(model, every=1)
    with dbg:
        for _ in range(3):
            x = torch.randn(8, 8)
            opt.zero_grad()
            loss = model(x, x[:, :3].argmax(dim=1))["loss"]
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert dbg._hooks.output_grads
    assert all(st.has_pgrad.sum() == 2 for st in seen if st.names)


def test_grad_tensors_of_an_output():
    a = torch.zeros(2, requires_grad=True) * 1.0
    b = torch.zeros(2)
    assert _grad_tensors(a) == [a] and _grad_tensors(b) == []
    got = _grad_tensors({"loss": a, "mask": b, "hidden": (a, b, None), "name": "x"})
    assert [t is a for t in got] == [True, True]
    assert _grad_tensors((b, [a])) == [a] and _grad_tensors("text") == []
    assert len(_grad_tensors([a] * (MAX_OUTPUT_HOOKS + 5))) == MAX_OUTPUT_HOOKS


def test_the_output_route_reads_gradients_under_torch_compile():
    model = stack(3)
    dbg, seen = monitored(model, every=2)
    classify(model, dbg, 6, call=torch.compile(model, backend="aot_eager"))  # traced once the hooks are in
    checked = [st for st in seen if st.names]
    assert dbg._hooks.output_grads and len(checked) == 3
    assert all(st.has_pgrad.sum() == 4 for st in checked)


class Checkpointed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        torch.manual_seed(0)
        self.reentrant = reentrant
        self.a = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.b = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.h = nn.Linear(16, 3)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return self.h(checkpoint(self.b, self.a(x), use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_reads_every_layer_s_gradients_from_the_first_step(reentrant):
    """Reentrant checkpointing accumulates the block's gradients in a backward of its own, which
    the output's pass does not see: its no_grad forward switches to parameter hooks. The
    non-reentrant kind keeps the output's route (its recomputation inside the backward is no
    sub-network call)."""
    def run_(**config):
        model = Checkpointed(reentrant)
        dbg, seen = monitored(model, every=1, **config)
        return classify(model, dbg, 4), [st for st in seen if st.names]

    hooks, want = run_(param_grad_hooks=True)
    auto, got = run_()
    assert auto._hooks.output_grads is not reentrant
    _same_gradients(got, want, 3)


def test_a_data_parallel_wrapper_reads_gradients_from_parameter_hooks(caplog):
    """A replica's gradient flows back through the wrapper's reduction: each rank's own gradient
    is read at its parameter's hook (here DataParallel without GPUs, which runs the module)."""
    model = stack(2)
    wrapped = nn.DataParallel(model)
    with caplog.at_level(logging.INFO, logger="neuraldbg"):
        dbg, seen = monitored(wrapped)
        classify(model, dbg, 3, call=wrapped)
    assert not dbg._hooks.output_grads and "data-parallel training" in caplog.text
    assert all(st.has_pgrad.sum() == 3 for st in seen if st.names)
