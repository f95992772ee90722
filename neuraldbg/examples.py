"""Tiny built-in training runs with known faults, for the demo, tests and docs.

Each run is seconds on one CPU core and fully determined by its seed: data are generated
in-process (a random teacher network labels Gaussian inputs), weights are initialized,
nothing is downloaded. The model zoo (``models/``) has the full reference architectures;
these are the smallest models that show each failure. Each fault is a
:class:`neuraldbg.faults.Injection` (the record the zoo and the benchmark use too), applied
through its hooks.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg.faults import Injection, rescale
from neuraldbg.monitor.monitor import NeuralDbg

ARCHS = ("mlp", "cnn", "transformer")
ONSET = 30  # step at which mid-run faults (NaN batch, input shift) start


@dataclass(frozen=True)
class ExampleConfig:
    """What a fault may change before an example is built: its learning rate and depth."""

    name: str
    lr: float
    deep: bool = False


def _scale_parameters(gain: float) -> Callable[[nn.Module, Any, Any], None]:
    """Model hook: every parameter (biases too) times ``gain``."""
    def hook(model: nn.Module, cfg: Any, trainer: Any) -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(gain)
    return hook


def _dead_first_layer(model: nn.Module, cfg: Any, trainer: Any) -> None:
    """Model hook: the first layer's bias at -10, so its ReLU units never fire."""
    first = next(m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d)))
    with torch.no_grad():
        first.bias.fill_(-10.0)


def _nan_entry(batch: tuple, step: int, inj: Injection) -> tuple:
    """Batch hook: one NaN in the first sample's input."""
    x = batch[0].clone()
    x[0].view(-1)[0] = float("nan")
    return (x, *batch[1:])


def _shifted(batch: tuple, step: int, inj: Injection) -> tuple:
    """Batch hook: inputs in other units (x1000)."""
    return (rescale(batch[0]), *batch[1:])


#: the examples' faults, by scenario name (``healthy`` first)
INJECTIONS: dict[str, Injection] = {inj.name: inj for inj in (
    Injection("healthy", ARCHS, None, "no fault", onset_frac=None),
    Injection("lr_too_high", ARCHS, ("learning_rate", "too_high"), "learning rate x1000", symptom="diverges",
              config=lambda c: replace(c, lr=c.lr * 1000.0)),
    Injection("init_too_small", ARCHS, ("initialization", "too_small"), "every parameter x1e-3", symptom="stuck",
              model=_scale_parameters(1e-3)),
    Injection("init_too_large", ARCHS, ("initialization", "too_large"), "every parameter x30", symptom="diverges",
              model=_scale_parameters(30.0)),
    Injection("nan_batch", ARCHS, ("data", "corrupted"), "one NaN input entry at the onset", symptom="nonfinite",
              onset_frac=0.25, batch=_nan_entry, one_shot=True),
    Injection("input_shift", ARCHS, ("data", "shifted"), "inputs x1000 from the onset on", symptom="jump",
              onset_frac=0.25, batch=_shifted),
    Injection("dead_relu", ARCHS, ("initialization", "too_small"), "first layer's bias at -10: dead ReLUs",
              symptom="stuck", model=_dead_first_layer),
    Injection("deep_sigmoid", ARCHS, ("architecture", "unstable"), "a deep sigmoid stack", symptom="stuck",
              config=lambda c: replace(c, deep=True)),
)}
#: scenario -> (root cause variable, state) it injects; None for healthy
SCENARIOS: dict[str, tuple[str, str] | None] = {name: inj.truth for name, inj in INJECTIONS.items()}


class TinyTransformer(nn.Module):
    """A 2-block pre-norm transformer over a sequence of feature vectors (B, T, d_in)."""

    def __init__(self, d_in: int = 16, d: int = 32, n_classes: int = 4, n_layers: int = 2, T: int = 8):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.pos = nn.Parameter(torch.zeros(1, T, d))
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=2 * d, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) + self.pos            # (B, T, d)
        h = self.blocks(h)                     # (B, T, d)
        return self.head(self.norm(h.mean(1)))  # (B, n_classes)


def build_model(arch: str, scenario: str = "healthy") -> nn.Module:
    """The tiny model of ``arch`` with the architectural part of ``scenario`` applied."""
    deep = INJECTIONS[scenario].apply_config(ExampleConfig(arch, 0.0)).deep if scenario in INJECTIONS else False
    if arch == "mlp":
        if deep:
            layers: list[nn.Module] = [nn.Linear(16, 32), nn.Sigmoid()]
            for _ in range(18):
                layers += [nn.Linear(32, 32), nn.Sigmoid()]
            return nn.Sequential(*layers, nn.Linear(32, 4))
        return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    if arch == "cnn":
        act: Callable[[], nn.Module] = nn.Sigmoid if deep else nn.ReLU
        depth = 10 if deep else 2
        layers = [nn.Conv2d(1, 8, 3, padding=1), act()]
        for _ in range(depth - 1):
            layers += [nn.Conv2d(8, 8, 3, padding=1), act()]
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4))
    if arch == "transformer":
        return TinyTransformer()
    raise ValueError(f"unknown example arch {arch!r}; valid: {', '.join(ARCHS)}")


def _input_shape(arch: str, batch: int) -> tuple[int, ...]:
    return {"mlp": (batch, 16), "cnn": (batch, 1, 8, 8), "transformer": (batch, 8, 16)}[arch]


@dataclass
class ExampleRun:
    """What an example run returns."""

    arch: str
    scenario: str
    seed: int
    losses: list[float]
    truth: tuple[str, str] | None
    dbg: NeuralDbg | None
    model: nn.Module = field(repr=False, default=None)


def train_example(arch: str = "mlp", scenario: str = "healthy", seed: int = 0, steps: int = 120, *,
                  monitor: bool | dict[str, Any] = True, batch: int = 32, lr: float | None = None) -> ExampleRun:
    """Train a tiny model on a seeded teacher task with one fault injected.

    ``monitor`` is False (no monitor), True, or a dict of :class:`NeuralDbg` keyword arguments.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; valid: {', '.join(SCENARIOS)}")
    if arch not in ARCHS:
        raise ValueError(f"unknown example arch {arch!r}; valid: {', '.join(ARCHS)}")
    inj = INJECTIONS[scenario].bind(ExampleConfig(arch, 0.0), steps, onset=ONSET)
    cfg = inj.apply_config(ExampleConfig(arch, lr if lr is not None else {"mlp": 0.05, "cnn": 0.05,
                                                                          "transformer": 0.01}[arch]))
    torch.manual_seed(seed)
    model = build_model(arch, scenario)
    inj.apply_model(model, cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    shape = _input_shape(arch, batch)
    teacher = torch.randn(16, 4, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    kwargs = {} if monitor is True else dict(monitor) if isinstance(monitor, dict) else None
    dbg = NeuralDbg(model, **{"optimizer": opt, **kwargs}) if kwargs is not None else None
    losses: list[float] = []
    ctx = dbg if dbg is not None else nullcontext()
    with ctx:
        for step in range(steps):
            x = torch.randn(*shape, generator=gen)
            x, y = inj.apply_batch((x, _labels(arch, x, teacher)), step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if dbg is not None:
                dbg.record_loss(loss)
            opt.step()
            losses.append(loss.item())
    return ExampleRun(arch, scenario, seed, losses, SCENARIOS[scenario], dbg, model)


def _labels(arch: str, x: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Labels a model of ``arch`` can represent: a linear teacher on pooled features."""
    if arch == "cnn":
        feats = F.adaptive_avg_pool2d(x, 2).flatten(1)   # (B, 4) quadrant means
        return feats.argmax(1)
    if arch == "transformer":
        return (x.mean(1) @ teacher).argmax(1)           # (B, T, 16) -> (B,)
    return (x @ teacher).argmax(1)
