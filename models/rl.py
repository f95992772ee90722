"""rl: PPO with a shared actor-critic on CartPole written in torch (no gym).

The environment is the classic cart-pole of Barto, Sutton & Anderson (1983), the same
constants and termination rules as gym's ``CartPole-v1`` but capped at 200 steps and
vectorised over ``n_envs`` copies. PPO (Schulman et al. 2017): rollouts of ``horizon`` steps
from every env, GAE(0.99, 0.95), clipped surrogate, value MSE, entropy bonus, ``epochs``
passes over ``minibatches`` minibatches. One runner step is one minibatch update; a new
rollout is collected whenever the previous one is used up.

Progress is ``episode_return`` (steps balanced per episode, reward 1 per step); ``entropy``
(the policy's mean entropy, nats) is logged every step. Rewards are scaled by
``reward_scale`` (0.1) before learning, the usual way to keep value targets O(1).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.injections import ONSET_FRAC, Injection, register_general, register_injection
from models.registry import ArchSpec, Trainer, register_arch, scale_weights


@dataclass
class RLConfig:
    """Hyper-parameters of the RL reference run (the healthy defaults)."""
    n_envs: int = 16
    horizon: int = 32
    max_episode: int = 200
    gamma: float = 0.99
    lam: float = 0.95
    epochs: int = 4
    minibatches: int = 4
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    reward_scale: float = 0.1
    hidden: int = 64
    depth: int = 2
    steps: int = 320  # minibatch updates (20 rollouts, 10k env steps)
    lr: float = 3e-3
    init_gain: float = 1.0
    # how bad "bad" is
    lr_high: float = 0.1
    lr_low: float = 3e-7
    init_large: float = 30.0
    unstable: bool = False  # arch_unstable: a 12-layer sigmoid trunk
    unstable_depth: int = 12


class CartPole:
    """``n`` cart-poles stepped together; auto-reset; observations (n, 4)."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    x_limit, theta_limit = 2.4, 12 * 2 * math.pi / 360

    def __init__(self, n: int, max_steps: int, gen: torch.Generator) -> None:
        self.n, self.max_steps, self.gen = n, max_steps, gen
        self.state = self._reset_state(n)
        self.t = torch.zeros(n, dtype=torch.long)

    def _reset_state(self, k: int) -> torch.Tensor:
        return 0.1 * torch.rand(k, 4, generator=self.gen) - 0.05

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply actions (n,) in {0, 1}; return (next obs, reward, done), resetting done envs."""
        x, x_dot, th, th_dot = self.state.unbind(1)
        force = (2 * action.float() - 1) * self.force_mag
        total, pml = self.masscart + self.masspole, self.masspole * self.length
        cos, sin = torch.cos(th), torch.sin(th)
        temp = (force + pml * th_dot**2 * sin) / total
        th_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos**2 / total)
        )
        x_acc = temp - pml * th_acc * cos / total
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * x_acc  # Euler, as gym
        th, th_dot = th + self.tau * th_dot, th_dot + self.tau * th_acc
        self.state = torch.stack([x, x_dot, th, th_dot], 1)
        self.t += 1
        fell = (x.abs() > self.x_limit) | (th.abs() > self.theta_limit)
        done = fell | (self.t >= self.max_steps)
        reward = torch.ones(self.n)
        if done.any():
            self.state[done] = self._reset_state(int(done.sum()))
            self.t[done] = 0
        return self.state.clone(), reward, done


class ActorCritic(nn.Module):
    """A shared tanh trunk with a policy head (2 logits) and a value head."""

    def __init__(self, cfg: RLConfig) -> None:
        super().__init__()
        depth = cfg.unstable_depth if cfg.unstable else cfg.depth
        Act = nn.Sigmoid if cfg.unstable else nn.Tanh
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(4 if i == 0 else cfg.hidden, cfg.hidden), Act()]
        self.trunk = nn.Sequential(*layers)
        self.policy = nn.Linear(cfg.hidden, 2)
        self.value = nn.Linear(cfg.hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)  # (B, hidden)
        return self.policy(h), self.value(h).squeeze(-1)  # (B, 2) logits, (B,) values


class PPOTrainer(Trainer):
    """Collect, then ``epochs x minibatches`` clipped-surrogate updates; Adam."""

    def __init__(self, cfg: RLConfig, seed: int, inj) -> None:
        super().__init__(cfg, seed, inj)
        self.gen = torch.Generator().manual_seed(130_000 + seed)
        self.env = CartPole(cfg.n_envs, cfg.max_episode, self.gen)
        self.obs = self.env.state.clone()
        self.model = ActorCritic(cfg)
        scale_weights(self.model, cfg.init_gain)
        inj.apply_model(self.model, cfg, self)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.queue: list[torch.Tensor] = []  # minibatch index sets left from the last rollout
        self.ep_len = torch.zeros(cfg.n_envs)
        self.finished: deque[float] = deque(maxlen=32)
        self._entropy: torch.Tensor | None = None
        self._new_return: float | None = None

    # -- rollouts --------------------------------------------------------------------

    def _act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, value = self.model(obs)
        # a NaN policy cannot be sampled; act uniformly and let the loss show the NaN
        safe = torch.nan_to_num(logits, nan=0.0, posinf=50.0, neginf=-50.0).clamp(-50, 50)
        dist = torch.distributions.Categorical(logits=safe)
        action = dist.sample()
        logp = torch.log_softmax(logits, -1).gather(1, action[:, None]).squeeze(1)
        return action, logp, value

    @torch.no_grad()
    def _collect(self, step: int) -> None:
        cfg = self.cfg
        obs_l, act_l, logp_l, val_l, rew_l, done_l = [], [], [], [], [], []
        # Categorical.sample uses the global RNG, which the runner has seeded and forked
        for _ in range(cfg.horizon):
            action, logp, value = self._act(self.obs)
            next_obs, reward, done = self.env.step(action)
            # the batch here is what the env reports: (observation, reward)
            next_obs, reward = self.inj.apply_batch((next_obs, reward), step)
            self.ep_len += 1
            for length in self.ep_len[done].tolist():
                self.finished.append(length)
            self.ep_len[done] = 0
            for buf, v in ((obs_l, self.obs), (act_l, action), (logp_l, logp), (val_l, value),
                           (rew_l, reward * cfg.reward_scale), (done_l, done)):
                buf.append(v)
            self.obs = next_obs
        rewards = torch.stack(rew_l)  # (horizon, n_envs)
        _, last_value = self.model(self.obs)
        values, dones = torch.stack(val_l), torch.stack(done_l).float()
        adv = torch.zeros_like(rewards)
        gae = torch.zeros(cfg.n_envs)
        for t in reversed(range(cfg.horizon)):  # GAE(gamma, lambda)
            nxt = last_value if t == cfg.horizon - 1 else values[t + 1]
            delta = rewards[t] + cfg.gamma * nxt * (1 - dones[t]) - values[t]
            gae = delta + cfg.gamma * cfg.lam * (1 - dones[t]) * gae
            adv[t] = gae
        self.buf = {
            "obs": torch.stack(obs_l).flatten(0, 1), "act": torch.stack(act_l).flatten(),
            "logp": torch.stack(logp_l).flatten(), "adv": adv.flatten(),
            "ret": (adv + values).flatten(),
        }
        n = cfg.n_envs * cfg.horizon
        size = n // cfg.minibatches
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, generator=self.gen)
            self.queue += list(perm.split(size))
        recent = list(self.finished) or self.ep_len.tolist()
        self._new_return = sum(recent) / len(recent)

    # -- the trainer protocol --------------------------------------------------------

    def forward_backward(self, step: int) -> torch.Tensor:
        cfg = self.cfg
        if not self.queue:
            self._collect(step)
        idx = self.queue.pop(0)
        b = {k: v[idx] for k, v in self.buf.items()}
        adv = (b["adv"] - b["adv"].mean()) / (b["adv"].std() + 1e-8)
        self.inj.zero_grad(self.optimizer, step)
        logits, value = self.model(b["obs"])
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(1, b["act"][:, None]).squeeze(1)
        ratio = torch.exp(logp - b["logp"])
        policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv).mean()
        value_loss = F.mse_loss(value, b["ret"])
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
        loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
        loss.backward()
        self._entropy = entropy.detach()
        return loss

    def signals(self, step: int) -> dict:
        out = {"entropy": self._entropy}
        if self._new_return is not None:
            out["episode_return"], self._new_return = self._new_return, None
        return out

    def summary(self) -> dict[str, float]:
        recent = list(self.finished)
        return {"mean_return_last": sum(recent) / len(recent) if recent else float("nan")}


SPEC = register_arch(ArchSpec(
    name="rl", family="rl", config=RLConfig, trainer=PPOTrainer,
    task="PPO on a torch CartPole (200-step cap); progress = episode return",
    input_layer="trunk.0", unstable_layer="trunk.0",
    progress=("episode_return", "up"),
    symptoms={"lr_too_high": "entropy_collapse", "init_too_large": "worse"},
    notes="arch_unstable: a 12-layer sigmoid trunk",
))
register_general("rl", ("healthy", "lr_too_high", "lr_too_low", "init_too_large",
                        "data_nan", "data_inf", "arch_unstable"))


OBS_OFFSET = 10.0


def _offset_observations(batch: tuple, step: int, inj: Injection) -> tuple:
    """From the onset on, observations arrive offset (a sensor recalibrated upstream)."""
    obs, reward = batch
    return obs + OBS_OFFSET, reward


register_injection(Injection(
    name="data_shift", archs=("rl",), truth=("data", "shifted"), symptom="worse",
    onset_frac=ONSET_FRAC, layer_of="trunk.0",
    description="from the onset on, observations arrive offset by +10 (a sensor recalibration; "
                "a pure x1000 rescale keeps every sign, which is all cart-pole control needs)",
    why="the observations' distribution moves mid-run; env dynamics, model and optimizer are "
        "untouched",
    batch=_offset_observations,
))


def _unscaled_rewards(batch: tuple, step: int, inj: Injection) -> tuple:
    """From the onset on, rewards arrive 1000x larger (a reward wrapper dropped upstream)."""
    obs, reward = batch
    return obs, reward * 1000.0


register_injection(Injection(
    name="rl_value_explosion", archs=("rl",), truth=("data", "shifted"), symptom="jump",
    onset_frac=ONSET_FRAC, layer_of="value",
    description="from the onset on, rewards arrive 1000x larger: value targets jump from O(1) "
                "to O(1e3), the value loss explodes and its gradients swamp the shared trunk",
    why="the reward signal (the data an RL agent learns from) changes scale mid-run; model, "
        "optimizer and learning rate are untouched",
    batch=_unscaled_rewards,
))
