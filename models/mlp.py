"""mlp: a plain multi-layer perceptron learning a random teacher network's labels.

Task: x ~ N(0, I_16); the label is the argmax of a fixed random two-layer tanh "teacher"
(4 classes). Fresh samples every step (no overfitting, no epochs). SGD with momentum, so a
too-high learning rate really diverges (Adam would bound the step size and hide it).

The ``compiled`` and ``dataparallel`` archs reuse everything here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.injections import GENERAL, LABEL_FAULTS, register_general
from models.registry import ArchSpec, Trainer, register_arch, scale_weights


@dataclass
class MLPConfig:
    """Hyper-parameters of the MLP reference run (the healthy defaults)."""
    in_dim: int = 16
    hidden: int = 64
    depth: int = 3  # hidden Linear+activation blocks
    n_classes: int = 4
    activation: str = "relu"
    batch_size: int = 64
    steps: int = 200
    lr: float = 0.05
    momentum: float = 0.9
    init_gain: float = 1.0  # multiplies the default (Kaiming-uniform) weights
    # how bad "bad" is, for the general injections
    lr_high: float = 5.0  # 100x: SGD overshoots and diverges within a few steps
    lr_low: float = 5e-6  # 1e-4x: nothing moves in the run
    init_small: float = 1e-2  # activations shrink 100x per layer
    init_large: float = 30.0  # activations grow 30x per layer
    unstable: bool = False  # arch_unstable: a deep stack of sigmoids
    unstable_depth: int = 16
    unstable_activation: str = "sigmoid"
    device: str = "cpu"  # "auto": cuda when available (dataparallel uses it)


ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU}


class Block(nn.Module):
    """Linear then activation; a separate module each so the monitor sees both."""

    def __init__(self, d_in: int, d_out: int, activation: str) -> None:
        super().__init__()
        self.fc = nn.Linear(d_in, d_out)
        self.act = ACTIVATIONS[activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class MLP(nn.Module):
    """``depth`` blocks of Linear+activation, then a linear head."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        depth = cfg.unstable_depth if cfg.unstable else cfg.depth
        act = cfg.unstable_activation if cfg.unstable else cfg.activation
        dims = [cfg.in_dim] + [cfg.hidden] * depth
        self.blocks = nn.ModuleList(Block(a, b, act) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(cfg.hidden, cfg.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, in_dim)
        for block in self.blocks:
            x = block(x)  # (B, hidden)
        return self.head(x)  # (B, n_classes) logits


class TeacherData:
    """Seeded stream of (x, y): y = argmax of a fixed random tanh teacher of x."""

    def __init__(self, cfg: MLPConfig, seed: int) -> None:
        self.cfg = cfg
        g = torch.Generator().manual_seed(10_000 + seed)
        self.w1 = torch.randn(cfg.in_dim, 32, generator=g) / cfg.in_dim**0.5
        self.w2 = torch.randn(32, cfg.n_classes, generator=g) / 32**0.5 * 3.0
        self.gen = torch.Generator().manual_seed(20_000 + seed)

    def label(self, x: torch.Tensor) -> torch.Tensor:
        """The teacher's class for each row of ``x``."""
        return (torch.tanh(x @ self.w1) @ self.w2).argmax(dim=1)

    def batch(self, step: int, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch (draws are sequential, so a run is reproducible as a whole)."""
        x = torch.randn(n or self.cfg.batch_size, self.cfg.in_dim, generator=self.gen)
        return x, self.label(x)


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; anything else as given."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


class MLPTrainer(Trainer):
    """Cross-entropy on the teacher's labels, SGD with momentum."""

    def __init__(self, cfg: MLPConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        self.device = resolve_device(cfg.device)
        self.data = TeacherData(cfg, seed)
        self.net = MLP(cfg)
        scale_weights(self.net, cfg.init_gain)  # on the CPU: same init on every device
        self.net.to(self.device)
        inj.apply_model(self.net, cfg, self)
        self.model = self.wrap(self.net)  # what NeuralDbg watches
        self.forward = self.model  # what training calls (compiled may replace it)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        g = torch.Generator().manual_seed(30_000 + seed)
        self.x_test = torch.randn(1024, cfg.in_dim, generator=g)
        self.y_test = self.data.label(self.x_test)
        self.x_test, self.y_test = self.x_test.to(self.device), self.y_test.to(self.device)

    def wrap(self, net: nn.Module) -> nn.Module:
        """The module training runs (and the monitor sees); dataparallel overrides this."""
        return net

    def forward_backward(self, step: int) -> torch.Tensor:
        x, y = self.inj.apply_batch(self.data.batch(step), step)
        x, y = x.to(self.device), y.to(self.device)
        self.inj.zero_grad(self.optimizer, step)
        loss = self.criterion(self.forward(x), y)
        loss.backward()
        return loss

    def summary(self) -> dict[str, float]:
        with torch.no_grad():
            acc = (self.net(self.x_test).argmax(1) == self.y_test).float().mean()
        return {"test_accuracy": float(acc)}


SPEC = register_arch(ArchSpec(
    name="mlp", family="mlp", config=MLPConfig, trainer=MLPTrainer,
    task="4-class labels of a random tanh teacher on 16-d Gaussian inputs",
    input_layer="blocks.0.fc", unstable_layer="blocks.0.fc", labels_at=1,
    notes="arch_unstable: 16 Linear+sigmoid blocks (vanishing gradients)",
))
register_general("mlp", GENERAL + LABEL_FAULTS)
