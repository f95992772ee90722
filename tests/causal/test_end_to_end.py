"""End to end on real (tiny) training runs: the issue's seven scenarios, three seeds each.

Each run trains a small MLP for 60 steps on a synthetic classification task under
``NeuralDbg`` and checks the top hypothesis (or ``P(healthy)``) against the injected fault.
"""
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.faults import Injection, corrupt_rows, rescale

STEPS = 60
ONSET = 30  # mid-run faults fire here, after a healthy warm-up
SEEDS = (0, 1, 2)
MLP = SimpleNamespace(name="mlp")  # the one architecture these faults apply to


def _scale_all(gain):
    def hook(model, lr, trainer):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(gain)
    return hook


#: the faults, as the shared records (neuraldbg/faults.py); ``config`` maps the learning rate
FAULTS = {inj.name: inj for inj in (
    Injection("healthy", ("mlp",), None, "no fault", onset_frac=None),
    Injection("lr_x1000", ("mlp",), ("learning_rate", "too_high"), "lr x1000", config=lambda lr: lr * 1000),
    Injection("init_x1e-3", ("mlp",), ("initialization", "too_small"), "parameters x1e-3", model=_scale_all(1e-3)),
    Injection("init_x30", ("mlp",), ("initialization", "too_large"), "parameters x30", model=_scale_all(30.0)),
    Injection("nan_batch", ("mlp",), ("data", "corrupted"), "NaN in a quarter of one batch", onset_frac=0.5,
              batch=lambda b, step, inj: (corrupt_rows(b[0], float("nan")), b[1]), one_shot=True),
    Injection("inputs_x1000", ("mlp",), ("data", "shifted"), "inputs x1000 from the onset", onset_frac=0.5,
              batch=lambda b, step, inj: (rescale(b[0]), b[1])),
    Injection("sigmoid20", ("mlp",), ("architecture", "unstable"), "a 20-layer sigmoid stack"),
)}


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
    inj = FAULTS[scenario].bind(MLP, STEPS)
    x, y = _data(seed)
    model = _mlp(20, 32, nn.Sigmoid) if scenario == "sigmoid20" else _mlp(3, 64, nn.ReLU)
    lr = inj.apply_config(0.05)
    inj.apply_model(model, lr)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1000 + seed)
    with NeuralDbg(model, family="mlp", optimizer=opt) as dbg:
        for step in range(STEPS):
            idx = torch.randint(0, len(x), (64,), generator=g)
            xb, yb = inj.apply_batch((x[idx], y[idx]), step)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            dbg.record_loss(loss)
            opt.step()
    return dbg


EXPECTED = {name: inj.truth for name, inj in FAULTS.items() if inj.truth is not None}


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
