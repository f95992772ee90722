"""The zoo's registry: the :class:`Trainer` protocol, :class:`ArchSpec` and the helpers
the architecture files share.

Every architecture file registers an :class:`ArchSpec` (its config dataclass, its
:class:`Trainer`, its family) at import time; :mod:`models.runner` drives them all.
This module imports neither the injections nor the runner, so both can import it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg.faults import scale_weights  # noqa: F401  (the init faults' edit, shared with every suite)
from neuraldbg.vocab import FAMILIES, validate_family

if TYPE_CHECKING:  # pragma: no cover
    from models.injections import Injection

__all__ = [
    "FAMILIES", "ArchSpec", "Trainer", "architectures", "config_fields", "default_config", "family",
    "get_arch", "register_arch", "scale_weights", "set_lr", "warmup_lr",
]


# ----------------------------------------------------------------------------------------
# the trainer protocol


class Trainer:
    """One architecture's training loop, cut where the monitor records the loss.

    Subclasses build ``model`` (the ``nn.Module`` NeuralDbg watches), ``optimizer`` (the one
    handed to NeuralDbg) and the data in ``__init__``; the runner then calls ``start()`` once
    and, per step, ``forward_backward(step)`` and ``optimizer_step(step)``. ``self.step`` is
    kept current by the runner so hooks (e.g. an injection's forward hook) can read it.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    #: the loss a classifier's loop applies to ``(output, labels)``: cross-entropy; a loss-kind
    #: fault (``models/injections.py``) swaps it, as a user's loop would use another
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = staticmethod(F.cross_entropy)

    def __init__(self, cfg: Any, seed: int, inj: "Injection") -> None:
        self.cfg, self.seed, self.inj = cfg, seed, inj
        self.step = 0

    def start(self) -> None:
        """Called once after the monitor (if any) is attached: compile or wrap here."""

    def forward_backward(self, step: int) -> torch.Tensor:
        """Zero grads, run one forward and backward pass, return the (0-d) loss."""
        raise NotImplementedError

    def optimizer_step(self, step: int) -> None:
        """Apply the update(s) for this step."""
        self.inj.apply_optimizer(self.optimizer, step)
        self.optimizer.step()

    def signals(self, step: int) -> dict[str, Any]:
        """Extra per-step measurements (floats or 0-d tensors); measured steps only."""
        return {}

    def summary(self) -> dict[str, float]:
        """End-of-run measurements (e.g. held-out accuracy)."""
        return {}

    def monitor_defaults(self) -> dict[str, Any]:
        """``NeuralDbg`` keyword arguments this run offers its monitor, as a user of this model
        would pass them (e.g. LoRA's ``reference``: the pre-trained task's held-out loss);
        the caller's own arguments win."""
        return {}

    # -- replay (verification) ------------------------------------------------------------

    def _shared(self) -> dict[int, Any]:
        """Objects a replay state shares instead of copying (a deepcopy memo): every module,
        parameter and buffer reachable from an attribute, and the main optimizer (NeuralDbg's
        snapshots restore those themselves)."""
        memo: dict[int, Any] = {id(self.optimizer): self.optimizer}
        for v in vars(self).values():
            for m in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(m, nn.Module):
                    for t in (*m.modules(), *m.parameters(), *m.buffers()):
                        memo[id(t)] = t
                elif isinstance(m, torch.utils.hooks.RemovableHandle):
                    memo[id(m)] = m
        return memo

    def replay_state(self) -> dict[str, Any]:
        """A copy of everything the next steps depend on besides the model and the main
        optimizer: data streams and their generators, an environment, buffers, a second
        optimizer, the injection's one-shot state. What a snapshot tracks for ``replay``."""
        return copy.deepcopy(dict(vars(self)), self._shared())

    def load_replay_state(self, state: dict[str, Any]) -> None:
        """Put a :meth:`replay_state` back (a fresh copy: the state can be loaded again)."""
        for k, v in copy.deepcopy(state, self._shared()).items():
            setattr(self, k, v)

    def replay(self, model: nn.Module, optimizer: Any, step: int) -> torch.Tensor:
        """One training step, as the runner takes it: ``replay(model, optimizer, step) -> loss``
        for ``NeuralDbg.verify`` (the trainer's own model and optimizer are the ones passed)."""
        self.step = step
        loss = self.forward_backward(step)
        self.optimizer_step(step)
        return loss


# ----------------------------------------------------------------------------------------
# the registry


@dataclass(frozen=True)
class ArchSpec:
    """What an architecture file registers: how to build and train it, and what it is."""

    name: str
    family: str
    config: type  # the config dataclass; its defaults are the healthy run
    trainer: Callable[[Any, int, "Injection"], Trainer]
    task: str  # one line: the healthy task
    input_layer: str | None = None  # first leaf module that sees the data (data faults)
    unstable_layer: str | None = None  # first leaf module of the unstable variant
    #: the module the loop bugs cut out of training (an optimizer without it, its output
    #: detached); ``input_layer`` unless that one's weights are tied to another module's
    loop_layer: str | None = None
    labels_at: int | None = None  # position of the class labels in a batch (label faults)
    targets_at: int | None = None  # position of a float regression target in a batch
    progress: tuple[str, str] = ("loss", "down")  # the series a healthy run improves
    symptoms: dict[str, str] = field(default_factory=dict)  # per-arch symptom overrides
    notes: str = ""


_ARCHS: dict[str, ArchSpec] = {}


def register_arch(spec: ArchSpec) -> ArchSpec:
    """Add an architecture to the zoo (names are unique; re-registering replaces)."""
    validate_family(spec.family)
    _ARCHS[spec.name] = spec
    return spec


def architectures() -> list[str]:
    """The registered architecture names, in registration order."""
    return list(_ARCHS)


def get_arch(arch: str) -> ArchSpec:
    """The spec of ``arch``; ``ValueError`` naming the valid ones if unknown."""
    try:
        return _ARCHS[arch]
    except KeyError:
        raise ValueError(
            f"unknown architecture {arch!r}; valid: {', '.join(_ARCHS)}"
        ) from None


def family(arch: str) -> str:
    """The architecture family of ``arch`` (one of ``FAMILIES``: ``dcgan -> gan``, ``compiled -> mlp``)."""
    return get_arch(arch).family


def default_config(arch: str, **overrides: Any) -> Any:
    """The healthy config of ``arch``, with ``overrides`` applied."""
    return replace(get_arch(arch).config(), **overrides)


# ----------------------------------------------------------------------------------------
# small helpers the architecture files share


def config_fields(cfg: Any) -> dict[str, Any]:
    """A config dataclass as a plain dict (for listings and docs)."""
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}


def warmup_lr(base_lr: float, step: int, warmup: int) -> float:
    """Linear warm-up to ``base_lr`` over ``warmup`` steps, then constant."""
    if warmup <= 0:
        return base_lr
    return base_lr * min(1.0, (step + 1) / warmup)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every param group's learning rate."""
    for g in optimizer.param_groups:
        g["lr"] = lr
