"""The hooks' cost model: unchecked steps do no tensor work, parameter gradients are measured
in one foreach call per backward pass, output gradients only when asked for."""
import collections

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from neuraldbg import NeuralDbg
from tests.tiny import spy_steps

#: view and alias ops: they create a tensor header, launch no kernel and touch no data
#: (``record_loss`` keeps ``loss.detach()``: the value is read with the next transfer)
NO_KERNEL = {"aten.detach.default", "aten.view.default", "aten.alias.default", "aten._reshape_alias.default"}


class Ops(TorchDispatchMode):
    """Counts every aten op dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


class Loop:
    """One model, its optimizer and a fixed stream of batches; ``dbg`` when monitored."""

    def __init__(self, monitor=None):
        self.model = mlp()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.gen = torch.Generator().manual_seed(0)
        self.dbg = None
        if monitor is not None:
            kw = dict(monitor)
            if kw.pop("optimizer", False):
                kw["optimizer"] = self.opt
            self.dbg = NeuralDbg(self.model, **kw).__enter__()

    def step(self):
        x = torch.randn(16, 8, generator=self.gen)
        self.opt.zero_grad()
        loss = F.cross_entropy(self.model(x), x[:, :3].argmax(dim=1))
        loss.backward()
        if self.dbg is not None:
            self.dbg.record_loss(loss)
        self.opt.step()


def extra_ops(monitor, warm=13):
    """Ops of one step under the monitor minus those of the same step without it."""
    bare, mon = Loop(), Loop(monitor)
    for _ in range(warm):
        bare.step()
        mon.step()
    with Ops() as b:
        bare.step()
    with Ops() as m:
        mon.step()
    mon.dbg.__exit__(None, None, None)
    d = m.ops.copy()
    d.subtract(b.ops)
    return {k: v for k, v in d.items() if v}


@pytest.mark.parametrize("monitor", [{"every": 10}, {"every": 10, "optimizer": True}])
def test_an_unchecked_step_launches_no_monitor_kernels(monitor):
    extra = extra_ops(monitor)  # step 13: unchecked
    assert set(extra) <= NO_KERNEL, extra
    assert sum(extra.values()) <= 2


def test_a_checked_step_measures_with_one_foreach_norm_per_backward():
    extra = extra_ops({"every": 10}, warm=10)  # step 10: checked
    # one for every parameter gradient at once; two for the step-size probe of the optimizer the
    # monitor found (the weights before the step, the update); one for the finiteness of the
    # weights after the update (neuraldbg/monitor/measurements/numerics.py)
    assert extra["aten._foreach_norm.Scalar"] == 4
    # no per-parameter squares of the gradients (the old path): of the three multiplications, two
    # are the step-size probe's (one per weight/update sum of squares it reduces per layer) and one
    # the input-scale measurement's (the entry layer's input squared, summed per feature); the
    # output spread copies the small output and reduces it when the transfer reads the step, and
    # the weights' check is judged later, a few checks at once (no isfinite on the checked step)
    assert extra.get("aten.index_add_.default", 0) == 2
    assert extra.get("aten.mul.Tensor", 0) == 3 and extra.get("aten.clone.default", 0) == 1
    assert extra.get("aten._local_scalar_dense.default", 0) <= 2  # the CPU input's finiteness check only


def test_parameter_gradients_are_unscaled_under_a_grad_scaler(monkeypatch):
    seen = spy_steps(monkeypatch)

    def run(**kw):
        seen.clear()
        lp = Loop()
        dbg = NeuralDbg(lp.model, **kw).__enter__()
        x = torch.randn(16, 8, generator=lp.gen)
        loss = F.cross_entropy(lp.model(x), x[:, :3].argmax(dim=1))
        scaler = kw.get("scaler")
        (scaler.scale(loss) if scaler else loss).backward()
        dbg.record_loss(loss)
        dbg.__exit__(None, None, None)
        return seen[0]

    plain = run()
    scaled = run(scaler=torch.amp.GradScaler("cpu"))
    assert scaled.grad_scale == 2.0 ** 16
    for layer in ("0", "2", "4"):  # a power-of-two scale: unscaling is exact
        assert scaled.layers[layer]["pgrad_sumsq"] == pytest.approx(plain.layers[layer]["pgrad_sumsq"], rel=1e-6)


def test_parameter_gradients_match_a_direct_computation(monkeypatch):
    seen = spy_steps(monkeypatch)
    lp = Loop({})
    want = []
    for _ in range(3):
        lp.step()
    lp.dbg.__exit__(None, None, None)
    lp2 = Loop()
    for _ in range(3):
        x = torch.randn(16, 8, generator=lp2.gen)
        lp2.opt.zero_grad()
        F.cross_entropy(lp2.model(x), x[:, :3].argmax(dim=1)).backward()
        want.append({n: float(m.weight.grad.pow(2).sum() + m.bias.grad.pow(2).sum())
                     for n, m in lp2.model.named_children() if isinstance(m, nn.Linear)})
        lp2.opt.step()
    for st, w in zip(seen, want):
        for layer, v in w.items():
            assert st.layers[layer]["pgrad_sumsq"] == pytest.approx(v, rel=1e-5)
            assert st.layers[layer]["pgrad_n"] == sum(p.numel() for p in lp.model[int(layer)].parameters())


def test_a_gradient_outside_a_backward_pass_is_measured_directly():
    model = mlp()
    dbg = NeuralDbg(model).__enter__()
    hooks = dbg._hooks
    p = model[0].weight
    p.grad = torch.full_like(p, 2.0)
    hooks._on_param_grad(0, "0", p)  # as a hook would, but no autograd engine is running
    assert hooks.buf.pgrad and hooks.buf.pgrad[0][1].item() == pytest.approx(2.0 * p.numel() ** 0.5)
    dbg.__exit__(None, None, None)


def test_the_forward_order_is_kept_by_the_hooks():
    lp = Loop({})
    lp.step()
    assert lp.dbg._hooks.order == ["0", "1", "2", "3", "4"]
    lp.dbg.__exit__(None, None, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_path_never_syncs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    gen = torch.Generator(device="cuda").manual_seed(0)
    xs = torch.randn(20, 16, 8, device="cuda", generator=gen)
    with NeuralDbg(model, optimizer=opt, sync_every=1000, every=2) as dbg:
        torch.cuda.set_sync_debug_mode("error")
        try:
            for step in range(20):
                opt.zero_grad()
                loss = F.cross_entropy(model(xs[step]), xs[step, :, :3].argmax(dim=1))
                loss.backward()
                dbg.record_loss(loss)
                opt.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert dbg.events == [] and dbg.trace().loss.n == 20


def test_compiled_hooks_measure_dead_units_without_recompiling():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    with torch.no_grad():
        model[0].bias.fill_(-10.0)  # every unit of the ReLU is dead
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    with NeuralDbg(model) as dbg:
        compiled = torch.compile(model)
        for step in range(8):
            x = torch.randn(16, 8, generator=gen)
            opt.zero_grad()
            loss = F.cross_entropy(compiled(x), x[:, :3].argmax(dim=1))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            if step == 1:
                graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs  # nothing recompiled after the first steps
    dead = [e for e in dbg.events if e.kind == "dead"]
    assert [(e.layer, e.step) for e in dead] == [("1", 0)] and dead[0].measured["dead_frac"] == 1.0
    assert dbg._hooks.order == ["0", "1", "2"]  # read on the host from the compiled hooks' records


# ---- deep models: nothing per module on unchecked steps, rotating shares on checked ones ----

def stack(n, width=8):
    torch.manual_seed(0)
    blocks = []
    for _ in range(n):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, 3))


def neuraldbg_calls(n_blocks, step_fn_steps=13, optimizer=False, **kw):
    """Python calls into neuraldbg during step ``step_fn_steps`` of a stack of ``n_blocks`` blocks,
    by ``file:function`` (``optimizer``: given to the monitor, else found)."""
    import sys

    model = stack(n_blocks)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    dbg = NeuralDbg(model, optimizer=opt if optimizer else None, **kw).__enter__()

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        dbg.record_loss(loss)
        opt.step()

    for _ in range(step_fn_steps):
        step()
    calls = collections.Counter()

    def prof(frame, event, arg):
        if event == "call" and "neuraldbg" in frame.f_code.co_filename:
            calls[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1

    sys.setprofile(prof)
    try:
        step()
    finally:
        sys.setprofile(None)
    dbg.__exit__(None, None, None)
    return calls


@pytest.mark.parametrize("optimizer", [False, True])
def test_an_unchecked_step_runs_no_python_of_the_monitor_per_module_or_parameter(optimizer):
    kw = {"every": 10, "optimizer": optimizer}
    shallow = neuraldbg_calls(2, **kw)
    deep = neuraldbg_calls(40, **kw)  # 20x the modules and parameters
    assert deep == shallow, (deep - shallow) + (shallow - deep)
    for hook in ("_on_output", "_on_param_grad", "_on_entry"):
        assert deep[f"hooks.py:{hook}"] == 0
    assert sum(deep.values()) < 60  # the per-step bookkeeping only (record_loss, the optimizer hooks)
    # between two unchecked steps the step closes without take or start, and its losses are queued
    # without the general packing
    assert deep["transfer.py:push_loss"] == 1 and deep["transfer.py:push"] == 0
    assert deep["hooks.py:take"] == deep["hooks.py:start_step"] == 0
    assert sum(deep.values()) < 45


@pytest.mark.parametrize("optimizer", [False, True])
def test_once_the_windows_closed_an_unchecked_optimizer_step_runs_none_of_the_parts(optimizer):
    """The loop's stale check (16 checked optimizer steps) and the resumed-optimizer check (64 steps)
    need the optimizer hooks on unchecked steps only until their windows close: then the global
    hooks return at once, and the step is the loss bookkeeping, the input hook and those two."""
    early = neuraldbg_calls(2, step_fn_steps=13, every=10, optimizer=optimizer)   # step 13: windows open
    late = neuraldbg_calls(2, step_fn_steps=203, every=10, optimizer=optimizer)   # step 203: both closed
    assert early["loop.py:optimizer_post"] == 1
    assert late["loop.py:optimizer_post"] == late["weights.py:optimizer_pre"] == 0
    assert late["optimizers.py:_global_pre"] == late["optimizers.py:_global_post"] == 1
    assert late["optimizers.py:_watched"] == 0
    assert sum(late.values()) <= 12, late


def test_a_checked_step_calls_the_entry_hooks_not_at_all_once_the_root_ran():
    calls = neuraldbg_calls(10, step_fn_steps=10, every=10)  # step 10: checked
    assert calls["hooks.py:_on_entry"] == 0
    assert calls["hooks.py:_on_output"] == 21  # every module, once


def stack_run(n_blocks, steps, every=1, **config):
    """A stack of ``n_blocks`` blocks trained ``steps`` steps under ``DetectorConfig(**config)``:
    the monitor, the checked steps' statistics and the parameter-gradient hooks it registered."""
    from neuraldbg.config import DetectorConfig

    model = stack(n_blocks)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    seen = []
    dbg = NeuralDbg(model, every=every, config=DetectorConfig(**config))
    orig = dbg._consume
    dbg._transfer._consume = lambda st: (seen.append(st), orig(st))
    with dbg:
        n_hooks = sum(len(handles) - 1 for _, handles in dbg._hooks.hooked.values())  # less the output hook
        train_steps(model, opt, dbg, steps, gen)
    return dbg, [st for st in seen if st.names], n_hooks


def train_steps(call, opt, dbg, steps, gen, batch=16):
    """``steps`` steps on random 8-feature batches (each row's class the largest of its first three
    inputs), ``call`` running the forward and each loss recorded in ``dbg``."""
    for _ in range(steps):
        x = torch.randn(batch, 8, generator=gen)
        opt.zero_grad()
        loss = F.cross_entropy(call(x), x[:, :3].argmax(dim=1))
        loss.backward()
        dbg.record_loss(loss)
        opt.step()


def rotated_run(n_blocks, above, steps, every=1, most=4):
    return stack_run(n_blocks, steps, every, rotate_modules_above=above, rotation_max_shares=most)[:2]


def test_rotation_shares_grow_in_number_then_in_size():
    from neuraldbg.monitor.hooks import rotation_shares

    assert [rotation_shares(n, 64, 4) for n in (7, 64, 65, 128, 129, 201, 1001)] == [1, 1, 2, 2, 3, 4, 4]
    assert rotation_shares(1001, 64, 1) == 1  # rotation_max_shares=1: every module on every check
    dbg, checked = rotated_run(10, above=4, steps=6, most=3)  # 21 modules: 3 shares of 7, not 6 of 4
    assert dbg._hooks.shares == 3
    assert all(st.has_out.sum() == 7 for st in checked[1:])


def test_a_rotated_layer_that_stays_dead_is_one_episode():
    """Regression: with more shares than DetectorConfig.collapse_gap_checks, a dead layer (seen once
    every 4 checks) was logged as a new episode at every sighting; now it is one run."""
    from neuraldbg.config import DetectorConfig

    model = stack(10)
    with torch.no_grad():
        model[4].bias.fill_(-100.0)  # the ReLU after it never fires
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    # every step checked: the layer is seen on every 4th check, 15 times
    with NeuralDbg(model, every=1, config=DetectorConfig(rotate_modules_above=4, rotation_max_shares=4)) as dbg:
        assert dbg._hooks.shares == 4
        train_steps(model, opt, dbg, 60, gen)
    dead = [e for e in dbg.events if e.kind == "dead" and e.layer == "5"]
    assert len(dead) == 1 and dead[0].step == 0 and dead[0].count > 10


def test_output_statistics_rotate_above_the_module_count_and_cover_every_layer():
    from neuraldbg.monitor.hooks import rotation_shares

    dbg, checked = rotated_run(10, above=8, steps=7)  # 21 modules: 3 shares of at most 8
    assert dbg._hooks.shares == rotation_shares(21, 8, 4) == 3
    names = set(checked[0].names)
    assert len(names) == 21 and checked[0].has_out.all()  # the first check measures every module
    for k in range(1, len(checked) - 2):  # then every 3 consecutive checks cover every module
        window = checked[k:k + 3]
        assert all(st.has_out.sum() <= 8 for st in window)
        covered = {st.names[i] for st in window for i in st.has_out.nonzero()[0]}
        assert covered == names
        assert all(st.has_pgrad.sum() == 11 for st in window)  # every parameter gradient, every check
    # the forward order is the model's, although later checks see a share at a time
    assert [layer.name for layer in dbg.layers()] == [str(i) for i in range(21)]


def test_the_rotation_is_logged_on_entry(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="neuraldbg"):
        rotated_run(10, above=8, steps=1)
    assert "21 monitored modules: their outputs are measured in 3 rotating shares" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="neuraldbg"):
        rotated_run(10, above=21, steps=1)
    assert "rotating shares" not in caplog.text


def test_no_rotation_up_to_the_threshold():
    dbg, checked = rotated_run(10, above=21, steps=4)
    assert dbg._hooks.shares == 1 and all(st.has_out.all() for st in checked)


def test_rotation_follows_the_checked_steps_not_every_step():
    dbg, checked = rotated_run(10, above=8, steps=40, every=5)  # checks at 0, 5, ..., 35
    assert [st.step for st in checked] == list(range(0, 40, 5))
    covered = {st.names[i] for st in checked[1:4] for i in st.has_out.nonzero()[0]}
    assert len(covered) == 21


class _Bump(nn.Module):
    """Adds 1 to its input in place when ``on`` (a later op that writes into an earlier output)."""

    def __init__(self):
        super().__init__()
        self.on = False

    def forward(self, x):
        return x.add_(1.0) if self.on else x


def _specs(model):
    """The monitor's per-module specs, read from its output hooks (partials over a Spec)."""
    return [fn.args[0] for m in model.modules() for fn in m._forward_hooks.values() if getattr(fn, "args", None)]


def _recorded(monkeypatch):
    seen = spy_steps(monkeypatch)
    return seen


def test_held_outputs_give_the_statistics_measured_in_each_hook(monkeypatch):
    from neuraldbg.monitor import held as H

    def run(defer):
        monkeypatch.setattr(H, "DEFER_NUMEL", H.DEFER_NUMEL if defer else 0)
        seen = _recorded(monkeypatch)
        torch.manual_seed(0)
        model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(16, 16), nn.ReLU())], nn.Linear(16, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1)
        with NeuralDbg(model) as dbg:
            for _ in range(4):
                x = torch.randn(32, 16, generator=gen)
                opt.zero_grad()
                loss = F.cross_entropy(model(x), x[:, :3].argmax(dim=1))
                loss.backward()
                dbg.record_loss(loss)
                opt.step()
        return [st.layers for st in seen if st.names]

    held, hooked = run(True), run(False)
    assert len(held) == len(hooked) == 4
    for a, b in zip(held, hooked):
        assert a.keys() == b.keys()
        for layer in a:
            for k in ("out_sum", "out_sumsq", "out_n", "dead_frac"):
                if k in b[layer]:
                    assert a[layer][k] == pytest.approx(b[layer][k], rel=1e-5, nan_ok=True), (layer, k)


def test_an_output_written_in_place_later_is_read_as_its_module_returned_it(monkeypatch):
    """Regression: an output held to the end of the forward and changed in place after its
    module ran (``ReLU(inplace=True)``, or an op that does so only on some steps) was read changed."""
    seen = _recorded(monkeypatch)
    torch.manual_seed(0)
    bump = _Bump()
    # the Linear after the bump shares the second one's shape: held with it, so the second is
    # still held when the write comes (an output held alone is measured in its hook after a check)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 16), bump, nn.Linear(16, 16),
                          nn.Linear(16, 3))
    truth = {}
    for i in (0, 2):
        model[i].register_forward_hook(lambda m, a, y, i=i: truth.__setitem__(str(i), float(y.detach().sum())))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    want = []
    with NeuralDbg(model) as dbg:
        for step in range(5):
            bump.on = step == 2  # the second Linear's output is written into at step 2 only
            x = torch.randn(16, 8, generator=gen)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), x[:, :3].argmax(dim=1))
            want.append(dict(truth))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
        specs = {s.name: s for s in _specs(model)}
    got = [st.layers for st in seen if st.names]
    assert len(got) == 5
    for step, (layers, w) in enumerate(zip(got, want)):
        # the first Linear's output is rewritten by the in-place ReLU on every step
        assert layers["0"]["out_sum"] == pytest.approx(w["0"], rel=1e-5)
        if step == 2:  # held when the write came: missing at that step, never the changed value
            assert "out_sum" not in layers["2"], layers["2"]
        else:
            assert layers["2"]["out_sum"] == pytest.approx(w["2"], rel=1e-5)
    # written into: measured in their hooks from then on; the head was measured alone at every flush
    assert specs["0"].defer is False and specs["2"].defer is False and specs["5"].defer is False


def test_an_output_measured_alone_at_a_flush_is_measured_in_its_hook_from_the_next_check():
    """Holding a small output pays for itself only when others of its kind, shape and dtype are
    measured with it: one measured alone is measured in its hook afterwards (same statistics,
    test_held_outputs_give_the_statistics_measured_in_each_hook)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    gen = torch.Generator().manual_seed(1)
    states = []
    with NeuralDbg(model, every=1) as dbg:
        for _ in range(3):
            x = torch.randn(16, 8, generator=gen)
            F.cross_entropy(model(x), x[:, :3].argmax(dim=1)).backward()
            dbg.record_loss(1.0)
            states.append({s.name: s.defer for s in _specs(model)})
    # first check: every small output a probe; second: held, the two Linear(8, 8) and the two
    # ReLUs measured together, the head alone; from then on the head in its hook
    assert states[0] == {"0": True, "1": True, "2": True, "3": True, "4": True}
    assert states[1] == states[2] == {"0": True, "1": True, "2": True, "3": True, "4": False}


def test_outputs_of_a_forward_on_another_thread_are_measured_in_their_hooks(monkeypatch):
    """Replicas run in threads (DataParallel on several GPUs) are measured in their hooks, never
    held: the held list belongs to the thread that entered the monitor."""
    import threading

    seen = _recorded(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(16, 8)
    truth = {}
    model[0].register_forward_hook(lambda m, a, y: truth.__setitem__("0", float(y.detach().sum())))
    with NeuralDbg(model) as dbg:
        out = {}
        worker = threading.Thread(target=lambda: out.setdefault("y", model(x)))
        worker.start()
        worker.join()
        specs = _specs(model)
        # nothing held by the worker's forward, not even as a probe (which would decide `defer`)
        assert dbg._hooks.held.items == [] and len(specs) == 3 and all(s.defer is None for s in specs)
        loss = F.cross_entropy(out["y"], x[:, :3].argmax(dim=1))
        loss.backward()
        dbg.record_loss(loss)
    layers = seen[0].layers
    assert layers["0"]["out_sum"] == pytest.approx(truth["0"], rel=1e-5)
    assert {"0", "1", "2"} <= {n for n, v in layers.items() if "out_sum" in v}


@pytest.mark.parametrize("every", [1, 3])
def test_a_module_s_parameters_share_one_gradient_hook_above_the_count_and_read_the_same(every):
    """Above ``group_param_hooks_above`` a weight and its bias share the weight's hook and the
    bias's gradient is read when the pass ends: the same gradients, half the hooks."""
    # 11 Linear layers, 22 parameters
    each, want, n_each = stack_run(10, 7, every, group_param_hooks_above=1000, param_grad_hooks=True)
    shared, got, n_shared = stack_run(10, 7, every, group_param_hooks_above=10, param_grad_hooks=True)
    assert not each._hooks.group_params and shared._hooks.group_params
    assert (n_each, n_shared) == (22, 11)
    assert [st.step for st in got] == [st.step for st in want] and len(got) >= 3
    for a, b in zip(got, want):
        assert (a.has_pgrad == b.has_pgrad).all() and a.has_pgrad.sum() == 11
        assert (a.cols["pgrad_n"] == b.cols["pgrad_n"]).all()
        assert a.cols["pgrad_sumsq"] == pytest.approx(b.cols["pgrad_sumsq"], rel=1e-6, nan_ok=True)
    assert [repr(e) for e in shared.events] == [repr(e) for e in each.events]
    # the hook's record of which parameters it stands for goes with the hooks
    assert not shared._hooks._mates



def micro_batch_run(steps=6, **config):
    """A stack of 10 blocks at every=2, two backward passes per step (``dbg.step`` set), under
    ``DetectorConfig(**config)``: the monitor and its checked steps' statistics."""
    from neuraldbg.config import DetectorConfig

    model = stack(10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    seen = []
    dbg = NeuralDbg(model, every=2, config=DetectorConfig(**config))
    orig = dbg._consume
    dbg._transfer._consume = lambda st: (seen.append(st), orig(st))
    with dbg:
        for step in range(steps):
            dbg.step = step
            opt.zero_grad()
            for _ in range(2):
                x = torch.randn(8, 8, generator=gen)
                loss = F.cross_entropy(model(x), x[:, :3].argmax(dim=1)) / 2
                loss.backward()
                dbg.record_loss(loss)
            opt.step()
    return dbg, [st for st in seen if st.names]


def test_a_shared_gradient_hook_reads_accumulated_micro_batches_as_a_hook_each():
    """Two backward passes per step (``dbg.step`` set): the module's other gradients are read at
    the end of each pass, as accumulated so far; the last pass's reading is the step's, as with a
    hook each."""
    def run_(above):
        return micro_batch_run(group_param_hooks_above=above, param_grad_hooks=True)

    each, want = run_(1000)
    shared, got = run_(10)
    assert shared._hooks.group_params and len(got) == len(want) == 3
    for a, b in zip(got, want):
        assert a.has_pgrad.sum() == b.has_pgrad.sum() == 11
        assert a.cols["pgrad_sumsq"] == pytest.approx(b.cols["pgrad_sumsq"], rel=1e-6, nan_ok=True)
