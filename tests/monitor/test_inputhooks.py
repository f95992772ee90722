"""The input hooks (``neuraldbg/monitor/inputhooks.py``). Sub-networks called directly: their
inputs are the model's input (a GAN's players).

Regression: a GAN wrapper whose own forward never runs had no input statistics, so a NaN or
rescaled real batch entering the discriminator was read as born inside the network (or not
at all) and the input shift went unseen.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, z):
        return self.discriminator(self.generator(z))


def train(fault=None, steps=40, onset=24):
    torch.manual_seed(0)
    gan = GAN()
    G, D = gan.generator, gan.discriminator
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(gan, family="gan", optimizer=opt_g) as dbg:
        for step in range(steps):
            dbg.step = step
            real = torch.randn(32, 8, generator=g).tanh()
            if fault == "nan" and step == onset:
                real[:8] = math.nan
            if fault == "shift" and step >= onset:
                real = real * 1000.0
            fake = G(torch.randn(32, 4, generator=g))
            d = D(torch.cat([real, fake.detach()])).squeeze(1)
            loss_d = F.binary_cross_entropy_with_logits(d, torch.cat([torch.ones(32), torch.zeros(32)]))
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            loss_g = F.binary_cross_entropy_with_logits(D(fake).squeeze(1), torch.ones(32))
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
            dbg.record_loss(loss_g.detach() + loss_d.detach())
    return dbg


def data_events(dbg, kind):
    return [e for e in dbg.events if e.type == "data_anomaly" and e.kind == kind]


def test_a_nan_real_batch_is_localized_at_the_discriminator_input():
    (ev,) = data_events(train("nan"), "nan")[:1]
    assert ev.layer == "discriminator.0" and ev.step == 24 and ev.measured["at_input"] == 1.0


def test_a_rescaled_real_batch_is_an_input_shift():
    evs = data_events(train("shift"), "shift")
    assert evs and evs[0].step == 24


def test_a_healthy_game_has_no_data_event():
    dbg = train()
    assert not [e for e in dbg.events if e.type == "data_anomaly"]


def test_a_model_called_through_its_root_counts_its_input_once():
    torch.manual_seed(0)
    gan = GAN()
    with NeuralDbg(gan) as dbg:
        dbg.step = 0
        gan(torch.randn(5, 4))  # the root runs: its children's inputs are internal
        buf = dbg._hooks.buf
        assert buf.root_called and buf.entry == []
        inputs = [r for r in buf.records if dbg._hooks.tables.slots[r[0]][0] == 2]
        assert len(inputs) == 1 and inputs[0][1] == 5 * 4


def test_input_records_read_floating_dense_tensors_with_elements():
    from neuraldbg.monitor.inputhooks import _input_records
    x = torch.tensor([[1.0, 2.0], [3.0, math.inf]])
    recs = _input_records(7, [x, torch.arange(4), torch.zeros(0, 3), torch.eye(2).to_sparse()])
    # token ids, an empty tensor and a sparse one are no input statistics; the float one is
    assert [(slot, n) for slot, n, _ in recs] == [(7, 4)]
    s, nr, finite, not_nan = (float(v) for v in recs[0][2])
    assert s == math.inf and finite == 3 and not_nan == 4
