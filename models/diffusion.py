"""diffusion: a DDPM with a tiny UNet on generated 8x8 shapes.

Forward process: x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps, with a linear beta schedule
over T = 100 steps; the UNet predicts eps from (x_t, t) and the loss is their MSE (Ho et
al. 2020). The UNet: an input conv, one down block (8 -> 4 pixels), a middle block, one up
block with a skip connection, an output conv; GroupNorm + SiLU, the timestep enters every
block through a small MLP on a sinusoidal embedding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.cnn import make_shapes
from models.injections import ONSET_FRAC, Injection, register_general, register_injection
from models.registry import ArchSpec, Trainer, register_arch, scale_weights


@dataclass
class DiffusionConfig:
    """Hyper-parameters of the Diffusion reference run (the healthy defaults)."""
    size: int = 8
    channels: int = 16
    t_dim: int = 32
    T: int = 100
    beta_start: float = 1e-4
    beta_end: float = 0.1
    batch_size: int = 32
    steps: int = 150
    lr: float = 2e-3
    init_gain: float = 1.0
    # how bad "bad" is
    lr_high: float = 1.0  # 500x
    lr_low: float = 2e-7  # 1e-4x
    init_large: float = 30.0
    unstable: bool = False  # arch_unstable: no norms, sigmoids, 4 extra mid blocks, no skip
    unstable_depth: int = 4


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of integer timesteps: (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1)


class ResBlock(nn.Module):
    """conv -> norm -> act (+ time) -> conv -> norm -> act, with a residual 1x1 if needed."""

    def __init__(self, c_in: int, c_out: int, t_dim: int, unstable: bool = False) -> None:
        super().__init__()
        Act = nn.Sigmoid if unstable else nn.SiLU
        Norm = (lambda c: nn.Identity()) if unstable else (lambda c: nn.GroupNorm(4, c))
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm1 = Norm(c_out)
        self.act1 = Act()
        self.time = nn.Linear(t_dim, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.norm2 = Norm(c_out)
        self.act2 = Act()
        self.residual = not unstable
        needs_proj = c_in != c_out and self.residual
        self.skip = nn.Conv2d(c_in, c_out, 1) if needs_proj else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.act1(self.norm1(self.conv1(x)))  # (B, c_out, H, W)
        h = h + self.time(temb)[:, :, None, None]
        h = self.act2(self.norm2(self.conv2(h)))
        return h + self.skip(x) if self.residual else h


class UNet(nn.Module):
    """(x_t (B, 1, 8, 8), t (B,)) -> predicted noise (B, 1, 8, 8)."""

    def __init__(self, cfg: DiffusionConfig) -> None:
        super().__init__()
        c, td, u = cfg.channels, cfg.t_dim, cfg.unstable
        self.t_dim = td
        self.time_mlp = nn.Sequential(nn.Linear(td, td), nn.SiLU(), nn.Linear(td, td))
        self.inc = nn.Conv2d(1, c, 3, padding=1)
        self.down = ResBlock(c, 2 * c, td, u)
        self.pool = nn.AvgPool2d(2)  # 8 -> 4
        self.mid = ResBlock(2 * c, 2 * c, td, u)
        n_deep = cfg.unstable_depth if u else 0  # extra middle blocks of arch_unstable
        self.deep = nn.ModuleList(ResBlock(2 * c, 2 * c, td, u) for _ in range(n_deep))
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")  # 4 -> 8
        self.use_skip = not u
        self.up = ResBlock(2 * c + (c if self.use_skip else 0), c, td, u)
        self.out = nn.Conv2d(c, 1, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h0 = self.inc(x)  # (B, c, 8, 8); first, so forward order starts where the data enters
        temb = self.time_mlp(timestep_embedding(t, self.t_dim))  # (B, t_dim)
        h = self.pool(self.down(h0, temb))  # (B, 2c, 4, 4)
        h = self.mid(h, temb)  # (B, 2c, 4, 4)
        for block in self.deep:
            h = block(h, temb)
        h = self.upsample(h)  # (B, 2c, 8, 8)
        if self.use_skip:
            h = torch.cat([h, h0], dim=1)  # (B, 3c, 8, 8)
        return self.out(self.up(h, temb))  # (B, 1, 8, 8)


class DDPMTrainer(Trainer):
    """Noise-prediction MSE at uniformly sampled timesteps; Adam."""

    def __init__(self, cfg: DiffusionConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        g = torch.Generator().manual_seed(100_000 + seed)
        self.x, _ = make_shapes(2048, cfg.size, g)  # (N, 1, 8, 8) in [-1, 1]
        self.gen = torch.Generator().manual_seed(101_000 + seed)
        betas = torch.linspace(cfg.beta_start, cfg.beta_end, cfg.T)
        self.abar = torch.cumprod(1 - betas, dim=0)  # (T,)
        self.model = UNet(cfg)
        scale_weights(self.model, cfg.init_gain)
        inj.apply_model(self.model, cfg, self)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)

    def forward_backward(self, step: int) -> torch.Tensor:
        cfg = self.cfg
        x0 = self.x[torch.randint(len(self.x), (cfg.batch_size,), generator=self.gen)]
        (x0,) = self.inj.apply_batch((x0,), step)
        t = torch.randint(cfg.T, (cfg.batch_size,), generator=self.gen)
        eps = torch.randn(x0.shape, generator=self.gen)
        ab = self.abar[t][:, None, None, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps  # (B, 1, 8, 8)
        self.inj.zero_grad(self.optimizer, step)
        loss = F.mse_loss(self.model(xt, t), eps)
        loss.backward()
        return loss


SPEC = register_arch(ArchSpec(
    name="diffusion", family="diffusion", config=DiffusionConfig, trainer=DDPMTrainer,
    task="DDPM noise prediction (T=100) on generated 8x8 shapes, tiny UNet",
    input_layer="inc", unstable_layer="down.conv1",
    notes="arch_unstable: no GroupNorm, sigmoids, no residuals or skip, 4 extra mid blocks",
))
# init_too_small is left out: GroupNorm rescales the tiny activations and Adam the tiny
# gradients, so the UNet trains as if healthy.
register_general("diffusion", ("healthy", "lr_too_high", "lr_too_low", "init_too_large",
                               "data_nan", "data_inf", "data_shift", "arch_unstable"))


def _nan_in_mid(model: UNet, cfg: DiffusionConfig, trainer: Trainer) -> None:
    """From the onset step on, the middle block's first conv emits a NaN activation."""
    inj = trainer.inj

    def hook(mod, inp, out):
        if inj.active(trainer.step):
            inj._state.setdefault("fired", trainer.step)
            out = out.clone()
            out[0, 0, 0, 0] = float("nan")
            return out
        return None

    model.mid.conv1.register_forward_hook(hook)


register_injection(Injection(
    name="unet_nan", archs=("diffusion",), truth=("numerics", "overflow"),
    symptom="nonfinite", onset_frac=ONSET_FRAC, layer_of="mid.conv1",
    description="from the onset on, one activation of the UNet's middle conv is NaN (stands in "
                "for an in-network numerical fault: an overflowing fp16 activation, an "
                "eps-free normalisation of a constant channel); inputs stay finite",
    why="data, learning rate and init are the healthy ones and the inputs are finite; the "
        "NaN is born inside the network out of a calm run: a value that left its dtype's range "
        "in the network's own computation (numerics/overflow), not the data's",
    model=_nan_in_mid,
))
