"""lstm: one-step-ahead forecasting of noisy sums of sines with an LSTM.

Each sequence is a sum of three sines with random frequency, amplitude and phase plus
Gaussian noise; the model reads it left to right and predicts the next value at every
position (MSE, after a short burn-in). A clean sum of three sines is an AR(6) process, so
the task is learnable from a few steps of memory, and the noise sets the loss floor.
Layers are single-layer ``nn.LSTM`` modules in a list, so each one reports separately.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.injections import register_general
from models.registry import ArchSpec, Trainer, register_arch, scale_weights


@dataclass
class LSTMConfig:
    """Hyper-parameters of the LSTM reference run (the healthy defaults)."""
    hidden: int = 32
    layers: int = 1
    seq_len: int = 32
    burn_in: int = 4  # the first predictions have no context; not scored
    n_sines: int = 3
    noise: float = 0.1
    batch_size: int = 32
    steps: int = 200
    lr: float = 1e-2
    grad_clip: float = 1.0  # the usual RNN safeguard; the faults below are not clipped away
    init_gain: float = 1.0
    gate_bias: float = 0.0  # added to the input- and forget-gate biases at init
    # how bad "bad" is
    lr_high: float = 1.0
    lr_low: float = 1e-6
    init_large: float = 30.0
    unstable: bool = False  # arch_unstable: input and forget gates saturated shut
    unstable_gate_bias: float = -16.0


class Forecaster(nn.Module):
    """Stacked single-layer LSTMs and a linear head: (B, T, 1) -> (B, T, 1)."""

    def __init__(self, cfg: LSTMConfig) -> None:
        super().__init__()
        self.lstm = nn.ModuleList(
            nn.LSTM(1 if i == 0 else cfg.hidden, cfg.hidden, batch_first=True)
            for i in range(cfg.layers)
        )
        self.head = nn.Linear(cfg.hidden, 1)
        gate_bias = cfg.unstable_gate_bias if cfg.unstable else cfg.gate_bias
        if gate_bias:
            with torch.no_grad():  # PyTorch gate order in the bias: input, forget, cell, output
                for layer in self.lstm:
                    for b in (layer.bias_ih_l0, layer.bias_hh_l0):
                        b[: 2 * cfg.hidden] += gate_bias / 2  # the two biases add up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, T, 1)
        for layer in self.lstm:
            x, _ = layer(x)  # (B, T, hidden)
        return self.head(x)  # (B, T, 1)


class Sines:
    """Seeded batches of noisy sums of sines: inputs x_0..x_{T-1}, targets x_1..x_T."""

    def __init__(self, cfg: LSTMConfig, seed: int) -> None:
        self.cfg = cfg
        self.gen = torch.Generator().manual_seed(110_000 + seed)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch, shapes (B, T, 1) each."""
        c, g = self.cfg, self.gen
        T = c.seq_len
        B, K = c.batch_size, c.n_sines
        freq = 0.03 + 0.2 * torch.rand(B, K, 1, generator=g)  # cycles per step
        amp = 0.3 + 0.7 * torch.rand(B, K, 1, generator=g)
        phase = 2 * math.pi * torch.rand(B, K, 1, generator=g)
        t = torch.arange(T + 1, dtype=torch.float32)
        x = (amp * torch.sin(2 * math.pi * freq * t + phase)).sum(1) / math.sqrt(K)  # (B, T+1)
        x = x + c.noise * torch.randn(x.shape, generator=g)
        return x[:, :-1, None], x[:, 1:, None]


class LSTMTrainer(Trainer):
    """Next-value MSE, Adam, gradient-norm clipping at 1."""

    def __init__(self, cfg: LSTMConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        self.data = Sines(cfg, seed)
        self.model = Forecaster(cfg)
        scale_weights(self.model, cfg.init_gain)
        inj.apply_model(self.model, cfg, self)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)

    def forward_backward(self, step: int) -> torch.Tensor:
        x, y = self.inj.apply_batch(self.data.batch(step), step)
        self.inj.zero_grad(self.optimizer, step)
        b = self.cfg.burn_in
        loss = F.mse_loss(self.model(x)[:, b:], y[:, b:])
        loss.backward()
        return loss

    def optimizer_step(self, step: int) -> None:
        # clip after the monitor has seen the raw gradients (record_loss came before)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        super().optimizer_step(step)


SPEC = register_arch(ArchSpec(
    name="lstm", family="rnn", config=LSTMConfig, trainer=LSTMTrainer,
    task="one-step-ahead forecast of noisy sums of three sines (MSE)",
    input_layer="lstm.0", unstable_layer="lstm.0", targets_at=1,
    # without the first layer's updates the forecast stays short of the healthy run's
    symptoms={"optimizer_misses_layer": "worse", "layer_detached": "worse"},
    notes="arch_unstable: input and forget gates saturated shut (bias -16): the cell keeps "
          "nothing, sigmoid derivatives ~1e-7, the recurrent gradient vanishes",
))
# init_too_small is left out: Adam rescales the tiny gradients and the LSTM trains anyway.
register_general("lstm", ("healthy", "lr_too_high", "lr_too_low", "init_too_large",
                          "data_nan", "data_inf", "data_shift", "arch_unstable", "nan_target"))
