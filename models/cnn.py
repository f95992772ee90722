"""cnn: a small convnet classifying generated 16x16 shapes (square, disc, plus, triangle).

The shapes are drawn in torch from a seed (random size and position, Gaussian pixel noise),
so nothing is downloaded; ``make_shapes`` is reused by the DCGAN. SGD with momentum, as for
the MLP, so the learning-rate faults behave as they do in plain supervised training.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.injections import GENERAL, LABEL_FAULTS, Injection, register_general, register_injection
from models.registry import ArchSpec, Trainer, register_arch, scale_weights
from neuraldbg.faults import width_one


def make_shapes(
    n: int, size: int, gen: torch.Generator, noise: float = 0.0,
    classes: tuple[int, ...] = (0, 1, 2, 3),
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images (n, 1, size, size) in [-1, 1] of random shapes, and their class ids."""
    labels = torch.tensor(classes)[torch.randint(len(classes), (n,), generator=gen)]
    r = size * (0.18 + 0.14 * torch.rand(n, generator=gen))  # half-size in pixels
    c = (size - 1) / 2 + (size / 2 - r[:, None] - 1).clamp(min=0) * (
        2 * torch.rand(n, 2, generator=gen) - 1
    )  # centre, kept inside the frame
    coords = torch.arange(size, dtype=torch.float32)
    dy = coords[None, :, None] - c[:, 0, None, None]  # (n, size, 1)
    dx = coords[None, None, :] - c[:, 1, None, None]  # (n, 1, size)
    r = r[:, None, None]
    square = (dx.abs() <= r) & (dy.abs() <= r)
    disc = dx**2 + dy**2 <= r**2
    plus = ((dx.abs() <= r / 3) & (dy.abs() <= r)) | ((dy.abs() <= r / 3) & (dx.abs() <= r))
    triangle = (dy.abs() <= r) & (dx.abs() <= (dy + r) / 2)
    masks = torch.stack([square, disc, plus, triangle], dim=1)  # (n, 4, size, size)
    img = masks[torch.arange(n), labels].float()  # (n, size, size)
    img = img * 2 - 1 + noise * torch.randn(img.shape, generator=gen)
    return img[:, None], labels


@dataclass
class CNNConfig:
    """Hyper-parameters of the CNN reference run (the healthy defaults)."""
    size: int = 16
    channels: tuple[int, int] = (8, 16)
    n_classes: int = 4
    noise: float = 0.3
    batch_size: int = 32
    steps: int = 150
    lr: float = 0.02
    momentum: float = 0.9
    init_gain: float = 1.0
    lr_high: float = 2.0
    lr_low: float = 2e-6
    init_small: float = 1e-2
    init_large: float = 20.0
    unstable: bool = False  # arch_unstable: 12 extra 3x3 conv + sigmoid layers
    unstable_depth: int = 12


class ConvBlock(nn.Module):
    """3x3 conv, activation, optional 2x2 max-pool."""

    def __init__(self, c_in: int, c_out: int, act: type[nn.Module], pool: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.act = act()
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.act(self.conv(x)))


class CNN(nn.Module):
    """Two conv blocks (16->8->4 pixels) and a linear head; the unstable variant inserts a
    deep stack of sigmoid convs between them."""

    def __init__(self, cfg: CNNConfig) -> None:
        super().__init__()
        c1, c2 = cfg.channels
        act = nn.Sigmoid if cfg.unstable else nn.ReLU
        blocks = [ConvBlock(1, c1, act, pool=True)]
        if cfg.unstable:
            blocks += [ConvBlock(c1, c1, act, pool=False) for _ in range(cfg.unstable_depth)]
        blocks.append(ConvBlock(c1, c2, act, pool=True))
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c2 * (cfg.size // 4) ** 2, cfg.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, 1, 16, 16)
        for block in self.blocks:
            x = block(x)  # (B, c1, 8, 8) ... (B, c2, 4, 4)
        return self.head(x.flatten(1))  # (B, n_classes)


class ShapeData:
    """A fixed seeded pool of noisy shapes, sampled in seeded minibatches."""

    def __init__(self, cfg: CNNConfig, seed: int, n: int = 2048) -> None:
        g = torch.Generator().manual_seed(40_000 + seed)
        self.x, self.y = make_shapes(n, cfg.size, g, noise=cfg.noise)
        self.x_test, self.y_test = make_shapes(512, cfg.size, g, noise=cfg.noise)
        self.gen = torch.Generator().manual_seed(50_000 + seed)
        self.batch_size = cfg.batch_size

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next random minibatch of the pool."""
        idx = torch.randint(len(self.y), (self.batch_size,), generator=self.gen)
        return self.x[idx], self.y[idx]


class CNNTrainer(Trainer):
    """Cross-entropy on shape classes, SGD with momentum."""

    def __init__(self, cfg: CNNConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        self.data = ShapeData(cfg, seed)
        self.model = CNN(cfg)
        scale_weights(self.model, cfg.init_gain)
        inj.apply_model(self.model, cfg, self)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum)

    def forward_backward(self, step: int) -> torch.Tensor:
        x, y = self.inj.apply_batch(self.data.batch(step), step)
        self.inj.zero_grad(self.optimizer, step)
        loss = self.criterion(self.model(x), y)
        loss.backward()
        return loss

    def summary(self) -> dict[str, float]:
        with torch.no_grad():
            pred = self.model(self.data.x_test).argmax(1)
        return {"test_accuracy": float((pred == self.data.y_test).float().mean())}


SPEC = register_arch(ArchSpec(
    name="cnn", family="cnn", config=CNNConfig, trainer=CNNTrainer,
    task="classify generated 16x16 shapes (square, disc, plus, triangle) with pixel noise",
    input_layer="blocks.0.conv", unstable_layer="blocks.0.conv", labels_at=1,
    notes="arch_unstable: 12 extra 3x3 conv+sigmoid layers, sigmoids throughout",
))
register_general("cnn", GENERAL + LABEL_FAULTS)


register_injection(Injection(
    name="bottleneck_width1", archs=("cnn",), truth=("unexplained", "not_learning"), symptom="stuck",
    layer_of="blocks.1",
    description="the last conv block's output squeezed through one unit (one number per image reaches the head)",
    why="rate, init, data and loop are the healthy ones, and nothing explodes, vanishes or saturates: four "
        "shapes cannot be told apart from one number, so the loss stays at chance -- a cause the network "
        "does not model (the leak)",
    trainer=lambda trainer, inj: width_one(trainer.model.get_submodule(inj.layer)),
))
