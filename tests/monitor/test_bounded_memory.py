"""The monitor's memory stays flat over a long run, even when every step is a failure."""
import tracemalloc

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import NeuralDbg


def run(steps, nan_every_step, sample_at):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    samples = {}
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            x = torch.randn(8, 8, generator=gen)
            if nan_every_step:
                x[0, 0] = float("nan")
            opt.zero_grad()
            loss = F.cross_entropy(model(x), x[:, :3].nan_to_num().argmax(1))
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            if step in sample_at:
                _ = dbg.events  # process everything queued so far
                samples[step] = tracemalloc.get_traced_memory()[0]
    return dbg, samples


@pytest.mark.slow
@pytest.mark.parametrize("nan_every_step", [False, True])
def test_memory_is_flat_over_20k_steps(nan_every_step):
    tracemalloc.start()
    try:
        dbg, samples = run(20_000, nan_every_step, sample_at={4_999, 19_999})
    finally:
        tracemalloc.stop()
    growth = samples[19_999] - samples[4_999]
    assert growth < 256 * 1024, f"{growth} bytes more after 15k further steps"
    assert len(dbg.trace().loss.history) <= 512 and len(dbg.events) < 50
