"""dcgan: a tiny DCGAN learning to draw the 16x16 shapes of ``cnn.py``.

Two models, two Adam optimizers (betas 0.5/0.999 as in the DCGAN paper), the
non-saturating generator loss. GAN losses are not a learning signal (they measure a moving
game), so progress is the ``sample_distance`` signal: how far a fixed batch of generated
images is from the real pool in per-pixel mean and standard deviation (0 = same first and
second moments). The recorded loss is ``loss_D + loss_G``.

What NeuralDbg watches: a :class:`GAN` wrapper module holding ``generator`` and
``discriminator``, so every layer of both reports under one qualified-name tree
(``generator.up1``, ``discriminator.conv1``...). The optimizer passed to it is the
generator's, the one stepped after ``record_loss`` (the discriminator steps inside
``forward_backward``, before the generator's backward).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from models.cnn import make_shapes
from models.injections import Injection, register_general, register_injection
from models.registry import ArchSpec, Trainer, register_arch, scale_weights


@dataclass
class DCGANConfig:
    """Hyper-parameters of the DCGAN reference run (the healthy defaults)."""
    size: int = 16
    z_dim: int = 16
    g_ch: int = 32
    d_ch: int = 16
    batch_size: int = 32
    steps: int = 200
    lr: float = 2e-3  # the generator's
    d_lr_mult: float = 4.0  # two time-scale update rule: D learns 4x faster (Heusel et al.)
    betas: tuple[float, float] = (0.5, 0.999)
    init_gain: float = 1.0
    saturating: bool = False  # gan_vanishing: G minimises log(1 - D(G(z)))
    # how bad "bad" is
    lr_high: float = 0.1
    lr_low: float = 2e-7
    init_small: float = 1e-2
    init_large: float = 30.0


class Generator(nn.Module):
    """z (B, z_dim) -> image (B, 1, 16, 16) in [-1, 1]."""

    def __init__(self, cfg: DCGANConfig) -> None:
        super().__init__()
        c = cfg.g_ch
        self.fc = nn.Linear(cfg.z_dim, c * 4 * 4)
        self.act0 = nn.ReLU()
        self.up1 = nn.ConvTranspose2d(c, c // 2, 4, stride=2, padding=1)  # 4 -> 8
        self.act1 = nn.ReLU()
        self.up2 = nn.ConvTranspose2d(c // 2, 1, 4, stride=2, padding=1)  # 8 -> 16
        self.out = nn.Tanh()
        self.c = c

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.act0(self.fc(z)).view(-1, self.c, 4, 4)  # (B, c, 4, 4)
        x = self.act1(self.up1(x))  # (B, c/2, 8, 8)
        return self.out(self.up2(x))  # (B, 1, 16, 16)


class Discriminator(nn.Module):
    """image (B, 1, 16, 16) -> real/fake logit (B,)."""

    def __init__(self, cfg: DCGANConfig) -> None:
        super().__init__()
        c = cfg.d_ch
        self.conv1 = nn.Conv2d(1, c, 4, stride=2, padding=1)  # 16 -> 8
        self.act1 = nn.LeakyReLU(0.2)
        self.conv2 = nn.Conv2d(c, 2 * c, 4, stride=2, padding=1)  # 8 -> 4
        self.act2 = nn.LeakyReLU(0.2)
        self.head = nn.Linear(2 * c * 4 * 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.conv1(x))  # (B, c, 8, 8)
        x = self.act2(self.conv2(x))  # (B, 2c, 4, 4)
        return self.head(x.flatten(1)).squeeze(1)  # (B,) logits


class GAN(nn.Module):
    """Holds both players so one monitor sees every layer of each."""

    def __init__(self, cfg: DCGANConfig) -> None:
        super().__init__()
        self.generator = Generator(cfg)
        self.discriminator = Discriminator(cfg)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.discriminator(self.generator(z))  # (B,) logits of generated samples


class RealShapes:
    """A fixed seeded pool of clean shapes in [-1, 1], sampled in minibatches."""

    def __init__(self, cfg: DCGANConfig, seed: int, n: int = 2048) -> None:
        g = torch.Generator().manual_seed(90_000 + seed)
        self.x, _ = make_shapes(n, cfg.size, g)
        self.gen = torch.Generator().manual_seed(91_000 + seed)
        self.batch_size = cfg.batch_size

    def batch(self, step: int) -> torch.Tensor:
        """The next random minibatch of real images (B, 1, 16, 16)."""
        return self.x[torch.randint(len(self.x), (self.batch_size,), generator=self.gen)]


def sample_distance(fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Mean squared gap of per-pixel mean and std between two image batches."""
    dm = (fake.mean(0) - real.mean(0)).pow(2).mean()
    ds = (fake.std(0) - real.std(0)).pow(2).mean()
    return dm + ds


class DCGANTrainer(Trainer):
    """One D step then one G step per training step; ``sample_distance`` every 10 steps."""

    signal_every = 10

    def __init__(self, cfg: DCGANConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        self.data = RealShapes(cfg, seed)
        self.model = GAN(cfg)
        scale_weights(self.model, cfg.init_gain)
        inj.apply_model(self.model, cfg, self)
        self.G, self.D = self.model.generator, self.model.discriminator
        self.optimizer = torch.optim.Adam(self.G.parameters(), lr=cfg.lr, betas=cfg.betas)
        self.optimizer_d = torch.optim.Adam(
            self.D.parameters(), lr=cfg.lr * cfg.d_lr_mult, betas=cfg.betas
        )
        self.zgen = torch.Generator().manual_seed(92_000 + seed)
        g = torch.Generator().manual_seed(93_000 + seed)
        self.z_eval = torch.randn(256, cfg.z_dim, generator=g)
        self.real_eval = self.data.x[:256]

    def forward_backward(self, step: int) -> torch.Tensor:
        (real,) = self.inj.apply_batch((self.data.batch(step),), step)
        z = torch.randn(real.shape[0], self.cfg.z_dim, generator=self.zgen)
        ones, zeros = torch.ones(real.shape[0]), torch.zeros(real.shape[0])
        # discriminator: real -> 1, fake -> 0
        self.inj.zero_grad(self.optimizer_d, step)
        fake = self.G(z)
        logits_d = self.D(torch.cat([real, fake.detach()]))  # one pass over both halves
        loss_d = 2 * F.binary_cross_entropy_with_logits(logits_d, torch.cat([ones, zeros]))
        loss_d.backward()
        self.optimizer_d.step()
        # generator: fool the (just updated) discriminator
        self.inj.zero_grad(self.optimizer, step)
        logits = self.D(fake)
        if self.cfg.saturating:  # minimise log(1 - D(G(z))) = -softplus(logit)
            loss_g = -F.softplus(logits).mean()
        else:  # non-saturating: maximise log D(G(z))
            loss_g = F.binary_cross_entropy_with_logits(logits, ones)
        loss_g.backward()
        return loss_d.detach() + loss_g

    def signals(self, step: int) -> dict:
        if step % self.signal_every and step != self.cfg.steps - 1:
            return {}
        with torch.no_grad():
            dist = sample_distance(self.G(self.z_eval), self.real_eval)
        return {"sample_distance": dist}


SPEC = register_arch(ArchSpec(
    name="dcgan", family="gan", config=DCGANConfig, trainer=DCGANTrainer,
    task="generate 16x16 shapes (square, disc, plus, triangle); progress = sample distance",
    input_layer="discriminator.conv1", loop_layer="generator.fc",
    progress=("sample_distance", "down"),
    # a generator whose first layer stays at its init draws from a narrower family of images
    symptoms={"optimizer_misses_layer": "worse", "layer_detached": "worse"},
    notes="architecture fault: gan_vanishing (saturating minimax loss)",
))
# Left out because they do not break this GAN: init_too_small (Adam rescales the tiny
# gradients and the pair trains anyway) and a deeper sigmoid discriminator (it still
# trains); the GAN's architecture fault is gan_vanishing.
register_general("dcgan", ("healthy", "lr_too_high", "lr_too_low", "init_too_large",
                           "data_nan", "data_inf", "data_shift"))

register_injection(Injection(
    name="gan_vanishing", archs=("dcgan",), truth=("architecture", "unstable"), symptom="worse",
    layer_of="discriminator.head",
    description="the original minimax generator loss log(1 - D(G(z))): once D rejects the "
                "early fakes confidently, the sigmoid saturates and G's gradient vanishes",
    why="the same players, data and optimizers (D at 4x G's LR) learn with the "
        "non-saturating loss; the vanishing comes from a saturating output non-linearity "
        "in the objective",
    config=lambda c: replace(c, saturating=True),
))
