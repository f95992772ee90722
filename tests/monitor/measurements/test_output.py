"""The output size: the last linear layer in forward order."""
from __future__ import annotations

from torch import nn

from neuraldbg.monitor.measurements import output as G


def test_last_out_features_is_the_output_size():
    mods = {"fc1": nn.Linear(4, 8), "act": nn.ReLU(), "head": nn.Linear(8, 5), "norm": nn.LayerNorm(5)}
    assert G.last_out_features(["fc1", "act", "head", "norm"], mods) == 5
    assert G.last_out_features(["act"], mods) is None


def _regression_run(steps=80, seed=0):
    """A 3-output regression (MSE) whose targets carry unit noise: the loss falls from about 5
    to its floor near 1.0, which is above 0.9 x ln 3 = 0.99."""
    import torch
    import torch.nn.functional as F

    from neuraldbg import NeuralDbg

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 3, generator=g) * 1.5
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            x = torch.randn(64, 8, generator=g)
            y = x @ w + torch.randn(64, 3, generator=g)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
            opt.zero_grad()
    return dbg


def test_a_regression_head_of_k_outputs_is_not_read_against_ln_k():
    """Regression: the chance level came from the last Linear's ``out_features`` whatever the
    loss, so a K-output regression that had learned down to its noise floor (above 0.9 ln K)
    read "stalled" and not healthy. A loss whose autograd graph holds no negative log-likelihood
    has no chance level; progress is read against the run's own start."""
    dbg = _regression_run()
    cov = dbg.coverage()
    assert cov["progress"].state == "learning"
    assert "out_features" not in dbg.trace().signatures.as_dict()
    assert dbg.posterior().is_healthy


def test_is_cross_entropy_tells_a_regression_from_a_classifier():
    import torch
    import torch.nn.functional as F

    from neuraldbg.monitor.lossinput import is_cross_entropy

    out = nn.Linear(4, 3)(torch.randn(5, 4))
    assert is_cross_entropy(F.cross_entropy(out, torch.tensor([0, 1, 2, 0, 1]))) is True
    assert is_cross_entropy(F.mse_loss(out, torch.zeros(5, 3))) is False  # whole graph read
    assert is_cross_entropy(F.mse_loss(out, torch.zeros(5, 3)).detach()) is None
    assert is_cross_entropy(1.5) is None
