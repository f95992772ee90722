"""End to end on real (tiny) training runs: the issue's seven scenarios, three seeds each.

Each run trains a small MLP for 60 steps on a synthetic classification task under
``NeuralDbg`` and checks the top hypothesis (or ``P(healthy)``) against the injected fault.
"""
import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg

STEPS = 60
ONSET = 30  # mid-run faults fire here, after a healthy warm-up
SEEDS = (0, 1, 2)


def _data(seed: int, n: int = 512, d: int = 20):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = (x @ torch.randn(d, generator=g) > 0).long()
    return x, y


def _mlp(depth: int, width: int, act: type[nn.Module], d: int = 20) -> nn.Sequential:
    layers: list[nn.Module] = []
    dims = [d] + [width] * (depth - 1)
    for i in range(depth - 1):
        layers += [nn.Linear(dims[i], dims[i + 1]), act()]
    layers.append(nn.Linear(width, 2))
    return nn.Sequential(*layers)


def train(scenario: str, seed: int):
    """Train one run with the scenario's fault injected; return the monitor."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    x, y = _data(seed)
    model = _mlp(20, 32, nn.Sigmoid) if scenario == "sigmoid20" else _mlp(3, 64, nn.ReLU)
    lr = 0.05 * (1000 if scenario == "lr_x1000" else 1)
    scale = {"init_x1e-3": 1e-3, "init_x30": 30.0}.get(scenario)
    if scale is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1000 + seed)
    with NeuralDbg(model, family="mlp", optimizer=opt) as dbg:
        for step in range(STEPS):
            idx = torch.randint(0, len(x), (64,), generator=g)
            xb, yb = x[idx], y[idx]
            if scenario == "nan_batch" and step == ONSET:
                xb = xb.clone()
                xb[:16] = float("nan")
            if scenario == "inputs_x1000" and step >= ONSET:
                xb = xb * 1000.0
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


EXPECTED = {
    "lr_x1000": ("learning_rate", "too_high"),
    "init_x1e-3": ("initialization", "too_small"),
    "init_x30": ("initialization", "too_large"),
    "nan_batch": ("data", "corrupted"),
    "inputs_x1000": ("data", "shifted"),
    "sigmoid20": ("architecture", "unstable"),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_fault_is_the_top_hypothesis(scenario, seed):
    dbg = train(scenario, seed)
    hyps = dbg.get_causal_hypotheses()
    assert hyps, f"{scenario}/{seed}: no hypothesis; evidence {dbg.posterior().evidence}"
    top = hyps[0]
    assert (top.cause, top.state) == EXPECTED[scenario], [str(h) for h in hyps]
    post = dbg.posterior()
    assert post[top.cause][top.state] == top.probability
    assert top.probability > post.p_healthy
    if scenario == "nan_batch":
        first_layer = dbg.trace().layers[0].name
        assert (top.origin_layer, top.onset_step) == (first_layer, ONSET)
        chain = dbg.trace_causal_chain("data_anomaly")
        assert (chain.cause, chain.first_layer, chain.first_step) == ("data", first_layer, ONSET)
    if scenario == "inputs_x1000":
        assert top.onset_step == ONSET
        assert dbg.explain_failure("data_anomaly")[0].state == "shifted"
    if scenario in ("init_x1e-3", "sigmoid20"):
        assert top.failure_type == "vanishing_gradients"


@pytest.mark.parametrize("seed", SEEDS)
def test_healthy_run_is_healthy(seed):
    dbg = train("healthy", seed)
    post = dbg.posterior()
    assert all(post.p_healthy > p for _, _, p in post.abnormal())
    assert post.p_healthy > 0.5
    assert dbg.get_causal_hypotheses() == []
    assert dbg.trace_causal_chain("exploding_gradients").empty


@pytest.mark.parametrize("scenario", ["init_x1e-3", "nan_batch"])
def test_exported_session_answers_the_same_offline(tmp_path, scenario):
    from neuraldbg import load_session

    dbg = train(scenario, 0)
    path = dbg.export_aquarium_package(tmp_path / "run.json")
    sess = load_session(path)
    assert [str(h) for h in sess.get_causal_hypotheses()] == [str(h) for h in dbg.get_causal_hypotheses()]
    assert sess.posterior() == dbg.posterior()
