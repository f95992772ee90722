"""dcgan, diffusion, lstm, gnn/gat, rl: models, data makers and run-level signals."""
from __future__ import annotations

import math

import pytest
import torch

import models
from models.dcgan import GAN, DCGANConfig, sample_distance
from models.diffusion import DiffusionConfig, UNet
from models.gnn import GNN, GNNConfig, SBMGraph
from models.lstm import LSTMConfig, Sines
from models.rl import ActorCritic, CartPole, RLConfig
from zoo_testing import cached_run


def test_gan_wrapper_and_sample_distance():
    torch.manual_seed(0)
    gan = GAN(DCGANConfig())
    z = torch.randn(4, 16)
    assert gan.generator(z).shape == (4, 1, 16, 16) and gan(z).shape == (4,)
    names = dict(gan.named_modules())
    assert "generator.up1" in names and "discriminator.conv1" in names
    x = torch.rand(64, 1, 16, 16)
    assert sample_distance(x, x) == 0 and sample_distance(x, -x) > 0


def test_gan_updates_both_players():
    spec = models.get_arch("dcgan")
    t = spec.trainer(spec.config(), 0, models.get_injection("dcgan", "healthy").bind(spec))
    g0 = [p.detach().clone() for p in t.G.parameters()]
    d0 = [p.detach().clone() for p in t.D.parameters()]
    t.forward_backward(0)
    t.optimizer_step(0)
    assert all(not torch.equal(a, b) for a, b in zip(g0, t.G.parameters()))
    assert all(not torch.equal(a, b) for a, b in zip(d0, t.D.parameters()))


def test_unet_shapes_and_schedule():
    cfg = DiffusionConfig()
    net = UNet(cfg)
    assert net(torch.randn(3, 1, 8, 8), torch.tensor([0, 50, 99])).shape == (3, 1, 8, 8)
    spec = models.get_arch("diffusion")
    t = spec.trainer(cfg, 0, models.get_injection("diffusion", "healthy").bind(spec))
    ab = t.abar
    assert (ab[1:] < ab[:-1]).all() and 0.9 < ab[0] < 1 and ab[-1] < 0.05


def test_unet_nan_is_born_inside_the_network():
    r = cached_run("diffusion", "unet_nan", 0)
    assert r.first_nonfinite_step == r.onset
    assert r.layer == "mid.conv1"


def test_sines_batches():
    x, y = Sines(LSTMConfig(), 0).batch(0)
    assert x.shape == y.shape == (32, 32, 1) and torch.equal(x[:, 1:], y[:, :-1])
    assert 0.1 < x.var() < 1.0  # ~0.24: three sines of mean power 0.23 each, over sqrt(3)^2


def test_lstm_gate_bias_saturates_the_gates():
    spec = models.get_arch("lstm")
    t = spec.trainer(spec.config(unstable=True), 0, models.get_injection("lstm", "healthy").bind(spec))
    b = t.model.lstm[0].bias_ih_l0 + t.model.lstm[0].bias_hh_l0
    assert (b[:64] < -10).all()  # input and forget gates shut


def test_sbm_graph():
    g = SBMGraph(GNNConfig(), 0)
    a = g.adj_raw
    assert torch.equal(a, a.T) and (a.diagonal() == 1).all()
    same = g.y[:, None] == g.y[None, :]
    off = ~torch.eye(len(g.y), dtype=torch.bool)
    p_in = a[same & off].mean()
    p_out = a[~same].mean()
    assert p_in > 4 * p_out  # communities are denser inside
    assert torch.allclose(g.adj_norm, g.adj_norm.T)


@pytest.mark.parametrize("conv", ["gcn", "gat"])
def test_deep_gnn_oversmooths(conv):
    """arch_unstable's mechanism: 16 plain layers make node representations collapse."""
    torch.manual_seed(0)
    cfg = GNNConfig(conv=conv)
    g = SBMGraph(cfg, 0)
    x, adj, _, _ = g.batch(conv)

    def spread(model):
        h = x
        for conv_, act in zip(model.convs[:-1], model.acts):
            h = act(conv_(h, adj))
        h = torch.nn.functional.normalize(h, dim=1)
        return (h - h.mean(0)).norm(dim=1).mean()  # how different the nodes still are

    shallow, deep = GNN(cfg), GNN(GNNConfig(conv=conv, unstable=True))
    assert len(deep.convs) == 16
    with torch.no_grad():
        assert spread(deep) < 0.3 * spread(shallow)


@pytest.mark.parametrize("arch", ["gnn", "gat"])
def test_gnn_generalises(arch):
    assert cached_run(arch, "healthy", 0).metrics["test_accuracy"] > 0.7


def test_cartpole_random_policy_falls_quickly():
    env = CartPole(64, 200, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    lengths, t = [], torch.zeros(64)
    for _ in range(200):
        _, r, done = env.step(torch.randint(2, (64,), generator=g))
        t += r
        lengths += t[done].tolist()
        t[done] = 0
    mean = sum(lengths) / len(lengths)
    assert 12 < mean < 40  # the textbook ~22 steps of a random cart-pole policy


def test_rl_signals_and_collapse():
    h = cached_run("rl", "healthy", 0)
    ent = h.series("entropy")
    assert abs(ent[0] - math.log(2)) < 0.05  # starts near uniform over 2 actions
    ret = h.series("episode_return")
    assert ret[-1] > 3 * ret[0]
    c = cached_run("rl", "lr_too_high", 0)
    assert max(c.series("entropy")[len(ent) // 2:]) < 0.5 * min(ent)
    v = cached_run("rl", "rl_value_explosion", 0)
    assert max(v.losses[v.onset:]) > 1e3 * max(v.losses[: v.onset])


def test_actor_critic_shapes():
    logits, value = ActorCritic(RLConfig())(torch.randn(5, 4))
    assert logits.shape == (5, 2) and value.shape == (5,)
