"""Training idioms that must not trip the monitor: mixed precision, accumulation, clipping,
validation inside the loop, several models, modules replaced mid-run. Real tiny training."""
import logging

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg
from neuraldbg.config import DetectorConfig

OVERFLOW_PATIENCE = DetectorConfig().scaler_overflow_patience


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def batch(gen, n=16):
    """A learnable task (so a healthy run makes progress): the class is the largest of 3 inputs."""
    x = torch.randn(n, 8, generator=gen)
    return x, x[:, :3].argmax(dim=1)


def amp_train(model, steps=60, *, scaler_kwargs=None, monitor=True, autocast=True, dtype=torch.bfloat16, seed=0,
              **monitor_kwargs):
    """A standard autocast + GradScaler loop; returns (losses, dbg, scales seen before each step)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", **(scaler_kwargs or {})) if scaler_kwargs is not None else None
    dbg = NeuralDbg(model, scaler=scaler, **monitor_kwargs) if monitor else None
    losses, scales = [], []
    if dbg:
        dbg.__enter__()
    try:
        for _ in range(steps):
            x, y = batch(gen)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=autocast):
                loss = F.cross_entropy(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if dbg:
                dbg.record_loss(loss)
            if scaler is not None:
                scales.append(scaler.get_scale())
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            losses.append(loss.detach().clone())
    finally:
        if dbg:
            dbg.__exit__(None, None, None)
    return losses, dbg, scales


# ---- mixed precision ---------------------------------------------------------------------

def test_autocast_bf16_healthy_run_has_no_events():
    _, dbg, _ = amp_train(mlp(), steps=80)
    assert dbg.events == []


def test_grad_scaler_statistics_are_unscaled(seen):
    amp_train(mlp(), steps=3, scaler_kwargs={}, autocast=False)
    scaled = list(seen)
    seen.clear()
    amp_train(mlp(), steps=3, autocast=False)
    # the default scale is a power of two, so unscaling is exact: same numbers as without scaler
    assert scaled[0].grad_scale == 2.0 ** 16 and seen[0].grad_scale is None
    for layer in ("0", "2", "4"):
        assert scaled[0].layers[layer]["pgrad_sumsq"] == pytest.approx(seen[0].layers[layer]["pgrad_sumsq"], rel=1e-6)


def test_grad_scaler_healthy_run_has_no_events():
    _, dbg, scales = amp_train(mlp(), steps=80, scaler_kwargs={})
    assert scales[0] == 2.0 ** 16
    assert dbg.events == []


def test_scaler_overflow_steps_are_skipped_not_reported():
    # float16 autocast with a too large initial scale overflows the first few backward passes,
    # and a short growth interval makes overflows come back periodically: the scaler skips each
    _, dbg, scales = amp_train(mlp(), steps=80, dtype=torch.float16,
                               scaler_kwargs={"init_scale": 2.0 ** 24, "growth_interval": 4})
    overflows = sum(b < a for a, b in zip(scales, scales[1:]))
    assert overflows >= 5  # the scaler really did skip steps
    assert dbg.events == []


class InfGrad(nn.Module):
    """Identity in the forward, an infinite gradient for its parameter on every backward."""

    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return x + torch.sqrt(self.w - self.w.detach())  # d sqrt(u)/du at u = 0 is inf


def test_recurring_overflow_is_reported():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), InfGrad(32), nn.ReLU(), nn.Linear(32, 3))
    _, dbg, scales = amp_train(model, steps=OVERFLOW_PATIENCE + 10, scaler_kwargs={})
    assert all(b < a for a, b in zip(scales, scales[1:]))  # every step skipped
    ev = [e for e in dbg.events if e.kind == "exploding"]
    assert [e.layer for e in ev] == ["1"]
    assert ev[0].step == OVERFLOW_PATIENCE - 1  # reported once the run reaches the patience
    assert ev[0].measured["overflow_steps"] == OVERFLOW_PATIENCE


def test_amp_training_is_bitwise_identical_with_monitor():
    l1, _, _ = amp_train(mlp(), steps=20, scaler_kwargs={}, monitor=False)
    m2 = mlp()
    l2, _, _ = amp_train(m2, steps=20, scaler_kwargs={})
    m1 = mlp()
    amp_train(m1, steps=20, scaler_kwargs={}, monitor=False)
    assert all(torch.equal(a, b) for a, b in zip(l1, l2))
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


# ---- accumulation, clipping ----------------------------------------------------------------

def test_gradient_accumulation_records_the_accumulated_gradient(seen):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    final = []
    with NeuralDbg(model, every=1) as dbg:
        for step in range(40):
            dbg.step = step
            opt.zero_grad()
            for _ in range(4):  # four micro-batches per optimizer step
                x, y = batch(gen, 4)
                loss = F.cross_entropy(model(x), y) / 4
                loss.backward()
                dbg.record_loss(loss * 4)
            final.append(float(model[0].weight.grad.pow(2).sum() + model[0].bias.grad.pow(2).sum()))
            opt.step()
    assert dbg.events == []
    assert len(seen) == 40
    for st, want in zip(seen, final):
        assert st.layers["0"]["pgrad_sumsq"] == pytest.approx(want, rel=1e-5)
        assert st.layers["0"]["out_n"] == 4 * 4 * 32  # the four micro-batches' activations


def test_clipping_does_not_hide_an_explosion():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    norms = []
    with NeuralDbg(model) as dbg:
        for step in range(60):
            if step == 30:
                with torch.no_grad():
                    model[4].weight.mul_(1e3)  # the last layer blows up backpropagated gradients
            x, y = batch(gen)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
            dbg.record_loss(loss)
            opt.step()
    assert max(norms[30:]) > 100  # clipping was hiding a large pre-clip norm from the optimizer
    ex = [e for e in dbg.events if e.kind == "exploding"]
    assert {e.layer for e in ex if e.step == 30} >= {"0", "2"}  # pre-clip norms are what is measured


# ---- validation inside the loop -----------------------------------------------------------

def net_with_dropout_bn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))


@pytest.mark.parametrize("no_grad", [True, False])
def test_validation_steps_raise_no_events(no_grad):
    model = net_with_dropout_bn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    with NeuralDbg(model) as dbg:
        for step in range(60):
            dbg.step = step
            model.train()
            x, y = batch(gen)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            if step % 10 == 9:
                model.eval()
                # a differently scaled validation set: it would read as a data shift if mixed in
                with torch.set_grad_enabled(not no_grad):
                    F.cross_entropy(model(50 * torch.randn(64, 8, generator=gen)), torch.zeros(64, dtype=torch.long))
    assert dbg.events == []


def test_model_trained_in_eval_mode_is_still_measured(seen, caplog):
    model = mlp()
    model.eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    with caplog.at_level(logging.INFO, logger="neuraldbg"):
        with NeuralDbg(model) as dbg:
            for _ in range(10):
                x, y = batch(gen)
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                dbg.record_loss(loss)
                opt.step()
    assert "out_sum" in seen[-1].layers["0"]
    assert sum("eval() mode" in r.getMessage() for r in caplog.records) == 1


# ---- several models and optimizers ----------------------------------------------------------

def test_gan_two_monitors_keep_per_model_traces():
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    gen = torch.Generator().manual_seed(0)
    bce = nn.BCEWithLogitsLoss()
    with NeuralDbg(G, family="gan") as dg, NeuralDbg(D, family="gan") as dd:
        for step in range(60):
            dg.step = dd.step = step
            real = torch.randn(16, 8, generator=gen) * 0.5 + 1.0
            z = torch.randn(16, 4, generator=gen)
            fake = G(z)
            opt_d.zero_grad()
            loss_d = bce(D(real), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
            loss_d.backward()
            dd.record_loss(loss_d)
            opt_d.step()
            opt_g.zero_grad()
            loss_g = bce(D(fake), torch.ones(16, 1))
            loss_g.backward()
            dg.record_loss(loss_g)
            opt_g.step()
    tg, td = dg.trace(), dd.trace()
    assert {l.type for l in tg.layers} == {"Linear", "ReLU"}
    assert {l.type for l in td.layers} == {"Linear", "LeakyReLU"}
    assert tg.loss.n == td.loss.n == 60
    bad = ("nan", "inf", "exploding", "vanishing", "dead")
    assert not [e for e in dg.events + dd.events if e.kind in bad]


# ---- modules replaced during training --------------------------------------------------------

def test_replaced_module_is_monitored_and_logged_once(seen, caplog):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    with caplog.at_level(logging.INFO, logger="neuraldbg"):
        with NeuralDbg(model, every=1) as dbg:
            for step in range(60):
                if step == 20:
                    model[2] = nn.Linear(32, 32)  # e.g. a layer re-initialised or swapped for an adapter
                    model[3] = nn.GELU()
                    opt = torch.optim.SGD(model.parameters(), lr=0.05)
                x, y = batch(gen)
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                dbg.record_loss(loss)
                opt.step()
    msgs = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
    assert len(msgs) == 2 and any("GELU" in m for m in msgs)
    assert "pgrad_sumsq" in seen[-1].layers["2"] and "out_sum" in seen[-1].layers["3"]
    assert "sat_frac" not in seen[-1].layers["3"]  # GELU is unbounded: its kind was re-read
    assert not [e for e in dbg.events if e.type != "optimizer_instability"]


# ---- long runs ------------------------------------------------------------------------------

def test_event_log_keeps_a_bounded_number_of_episodes():
    from neuraldbg.events.base import DATA, make_event
    from neuraldbg.events.compress import MAX_EPISODES, EventLog

    log = EventLog(gap=3)
    for step in range(0, 20_000, 100):  # a condition flickering every 100 steps, 200 times
        log.add(make_event(DATA, "shift", "0", step, 1.0))
    evs = log.events
    assert len(evs) == MAX_EPISODES
    assert evs[-1].end_step == 19_900 and sum(e.count for e in evs) == 200


# ---- the user guide's examples run as written ---------------------------------------------

def test_docs_examples_run():
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "idioms.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 7
    ns: dict = {}
    for block in blocks:  # the first block defines the helpers the others use
        exec(compile(block, "docs/idioms.md", "exec"), ns)  # noqa: S102


class Adapter(nn.Module):
    """A LoRA-style wrapper: the old layer moves under ``base``, plus a parameter of its own."""

    def __init__(self, base):
        super().__init__()
        self.base = base
        self.scale = nn.Parameter(torch.ones(base.out_features))

    def forward(self, x):
        return self.base(x) * self.scale


def test_wrapped_module_moves_to_its_new_name(seen):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    with NeuralDbg(model, every=1) as dbg:
        for step in range(40):
            if step == 10:
                model[2] = Adapter(model[2])
                opt = torch.optim.SGD(model.parameters(), lr=0.05)
            x, y = batch(gen)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            dbg.record_loss(1.0)
            opt.step()
    last = seen[-1].layers
    assert last["2.base"]["pgrad_n"] == 32 * 32 + 32  # the Linear, under its new name
    assert last["2"]["pgrad_n"] == 32 and last["2"]["out_n"] == 16 * 32  # the adapter's own, once
