"""The weights on entry: reference init scales, the weight-scale factor, low-rank adapters."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from neuraldbg.monitor.measurements import weights as G


def test_fans_follow_torch_init():
    assert G.fans(torch.Size((32, 64))) == (64, 32)
    assert G.fans(torch.Size((8, 3, 5, 5))) == (75, 200)


def test_reference_stds_of_a_linear_layer():
    refs = G.reference_stds(nn.Linear(64, 32), torch.Size((32, 64)))
    assert refs[:4] == pytest.approx((1 / math.sqrt(192), 1 / 8, math.sqrt(2 / 64), math.sqrt(2 / 96)))
    assert G.TRANSFORMER_STD in refs
    assert 1.0 in G.reference_stds(nn.Embedding(10, 4), torch.Size((10, 4)))  # N(0, 1) default


def test_nearest_factor_picks_the_closest_reference_in_log_space():
    assert G.nearest_log10_factor(0.02, (0.02, 0.1)) == pytest.approx(0.0)
    assert G.nearest_log10_factor(2.0, (0.02, 0.2)) == pytest.approx(1.0)
    assert G.nearest_log10_factor(0.002, (0.02, 0.2)) == pytest.approx(-1.0)


def test_init_scale_on_hand_set_weights():
    lin = nn.Linear(64, 32)
    with torch.no_grad():
        lin.weight.fill_(1 / math.sqrt(192))  # exactly PyTorch's default std
    f, n = G.init_scale([("fc", lin)])
    assert n == 1 and f == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        lin.weight.fill_(100 / math.sqrt(192))  # x100: nearest reference sqrt(2/64)
    assert G.init_scale([("fc", lin)])[0] == pytest.approx(math.log10(100 / math.sqrt(192) / math.sqrt(2 / 64)))


def test_default_initialized_layers_read_as_their_reference():
    torch.manual_seed(0)
    mods = [("a", nn.Linear(128, 64)), ("b", nn.Conv2d(8, 16, 3)), ("c", nn.Linear(64, 10))]
    f, n = G.init_scale(mods)
    assert n == 3 and abs(f) < 0.05


def test_zero_weights_by_design_are_left_out():
    torch.manual_seed(0)
    a, b = nn.Linear(32, 4, bias=False), nn.Linear(4, 32, bias=False)
    nn.init.zeros_(b.weight)  # a LoRA B
    f, n = G.init_scale([("lora_A", a), ("lora_B", b)])
    assert n == 1 and abs(f) < 0.1
    assert G.init_scale([("lora_B", b)]) == (None, 0)


def test_config_init_range_reads_a_library_config():
    m = nn.Linear(2, 2)
    assert G.config_init_range(m) is None
    m.config = type("Cfg", (), {"initializer_range": 0.01})()
    assert G.config_init_range(m) == 0.01


@pytest.mark.parametrize("value,trusted", [(0.02, True), (0.002, True), (0.2, True), (0.05, True),
                                           (0.0019, False), (0.21, False), (2.0, False), (0.0002, False)])
def test_a_config_range_is_trusted_only_near_the_convention(value, trusted):
    assert G.range_trusted(value) is trusted
    m = nn.Linear(2, 2)
    m.config = type("Cfg", (), {"initializer_range": value})()
    assert G.config_init_range(m) == (value if trusted else None)
    assert G.config_init_range(m, trusted=False) == value


def test_weights_drawn_from_a_faulty_config_range_read_off_scale():
    """The bug this pins: weights drawn at std 2.0 from a config's initializer_range 2.0 read as
    normal, because the config's value was trusted as their reference scale."""
    torch.manual_seed(0)
    lin = nn.Linear(256, 256)
    nn.init.normal_(lin.weight, 0.0, 2.0)
    assert G.init_scale([("fc", lin)], init_range=2.0)[0] == pytest.approx(0.0, abs=0.02)  # trusted: "normal"
    lin.config = type("Cfg", (), {"initializer_range": 2.0})()
    f, _ = G.init_scale([("fc", lin)], G.config_init_range(lin))
    assert f > 1.0  # 2.0 against Xavier's 0.088, the nearest reference left


class _LoRA(nn.Module):
    """PEFT's layout: the frozen layer and the adapter pair one level down."""

    def __init__(self, out_f=6, in_f=5, r=2, transposed=False):
        super().__init__()
        self.base_layer = nn.Linear(in_f, out_f, bias=False)
        if transposed:  # GPT-2's Conv1D stores the weight as (in, out)
            self.base_layer.weight = nn.Parameter(torch.randn(in_f, out_f))
        self.base_layer.weight.requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(in_f, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, out_f, bias=False)})


def test_adapters_are_found_by_structure_whatever_their_names():
    model = nn.Sequential(_LoRA(), nn.ReLU(), _LoRA(transposed=True), nn.Linear(6, 3))
    found = G.low_rank_adapters(model)
    assert sorted(name for name, *_ in found) == ["0", "2"]
    for _, w, a, b in found:
        assert not w.requires_grad and a.shape[0] == b.shape[1] == 2


def test_a_trainable_square_layer_is_not_an_adapter():
    assert G.low_rank_adapters(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))) == []


def test_adapter_scale_on_hand_set_weights():
    m = _LoRA(out_f=2, in_f=2, r=1)
    with torch.no_grad():
        m.base_layer.weight.copy_(torch.tensor([[3.0, 0.0], [0.0, 4.0]]))   # ||W|| = 5
        m.lora_A["default"].weight.copy_(torch.tensor([[1.0, 2.0]]))
        m.lora_B["default"].weight.copy_(torch.tensor([[1.0], [0.0]]))      # BA = [[1, 2], [0, 0]]
    ratio, n = G.adapter_scale(m)
    assert n == 1 and ratio == pytest.approx(5 ** 0.5 / 5)
    with torch.no_grad():
        m.lora_B["default"].weight.zero_()
    assert G.adapter_scale(m) == (0.0, 1)   # LoRA's own start: B = 0
    assert G.adapter_scale(nn.Linear(3, 3)) == (None, 0)


# ---- runs that do not start at initialization -----------------------------------------------

def trained_state(steps=60, seed=0):
    """The state_dict of tiny.mlp after a healthy run (its loss well below chance ln 3)."""
    from tests.tiny import run
    return {k: v.clone() for k, v in run(steps=steps, lr=0.2, seed=seed).model.state_dict().items()}


def test_a_loaded_trained_state_dict_under_a_fresh_optimizer_is_not_read_as_an_initialization():
    from tests.tiny import batches, mlp, run
    model = mlp()
    model.load_state_dict(trained_state())
    r = run(model, steps=40, lr=0.05, data=batches(100)[60:], monitor={"optimizer": True})
    dbg = r.dbg
    post = dbg.posterior()
    assert post.is_healthy and post.p_healthy >= 0.5
    assert all(h.cause != "initialization" for h in dbg.get_causal_hypotheses())
    cov = dbg.coverage()["init_scale"]
    assert not cov.observed and cov.reason.startswith("not at initialization: the first loss")
    assert "x chance level ln 3" in cov.reason


def test_a_fresh_run_is_read_at_initialization():
    from tests.tiny import run
    for seed in range(3):  # a fresh classifier starts near chance ln K, whatever the seed
        dbg = run(steps=30, seed=seed, monitor={"optimizer": True}).dbg
        assert dbg.coverage()["init_scale"].observed, seed


def test_the_first_loss_sign_reads_only_a_cross_entropy():
    """A regression loss sits far below ln K at any initialization: it says nothing of training."""
    from neuraldbg import NeuralDbg
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(5):
            x = torch.randn(16, 8)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), torch.zeros(16, 10))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert dbg.trace().loss.history[0][1] < G.TRAINED_START * math.log(10)
    assert dbg.coverage()["init_scale"].observed


def test_a_float_loss_decides_nothing():
    from tests.tiny import mlp
    from neuraldbg import NeuralDbg
    model = mlp()
    model.load_state_dict(trained_state())
    with NeuralDbg(model) as dbg:
        dbg.record_loss(0.01)  # a number: whether it is a cross-entropy cannot be told
    assert dbg.coverage()["init_scale"].observed


def test_at_init_wins_over_the_first_loss():
    from tests.tiny import batches, mlp, run
    for at_init, observed in ((True, True), ("loaded from my_run.pt", False)):
        model = mlp()
        model.load_state_dict(trained_state())
        dbg = run(model, steps=5, data=batches(100)[60:], monitor={"optimizer": True, "at_init": at_init}).dbg
        cov = dbg.coverage()["init_scale"]
        assert cov.observed is observed
        if not observed:
            assert cov.reason == "not at initialization: loaded from my_run.pt"


def test_an_optimizer_that_first_steps_late_is_a_new_phase_not_a_resume():
    """Once the windows closed, unchecked steps no longer hear the optimizers: an optimizer built
    mid-run on such a step is first heard on a later one, already holding state. Only an optimizer
    found within ``FOUND_WITHIN`` steps of the first one heard says how the run began; this one
    starts a second phase, and the initialization measured on entry stands."""
    import torch.nn.functional as F

    from neuraldbg import NeuralDbg
    from neuraldbg.monitor.measurements.weights import FOUND_WITHIN, InitScale

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    with NeuralDbg(model, every=10) as dbg:
        for step in range(FOUND_WITHIN + 200):
            if step == FOUND_WITHIN + 143:  # a second phase, on an unchecked step after both windows
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    assert dbg.addon(InitScale).not_at_init is None
    assert dbg.signatures().gap(next(iter(InitScale.signatures))) is None
