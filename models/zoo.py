"""The zoo's registry and its one runner.

Every architecture file registers an :class:`ArchSpec` (its config dataclass, its
:class:`Trainer`, its family) at import time; :func:`run` drives any of them the same way:

    bind the injection -> build the trainer -> (attach NeuralDbg) -> loop:
        dbg.step = step
        loss = trainer.forward_backward(step)     # zero_grad, forward, backward
        dbg.record_loss(loss)                     # after backward, before the optimizer
        trainer.optimizer_step(step)

so the benchmark and the tests see every architecture through one door, monitored or not.
Runs never touch global state for good: the torch RNG is forked (and restored) around the
run, and a ``threads=`` request is undone on exit.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from models.injections import Injection

logger = logging.getLogger("neuraldbg.models")

#: The architecture families of API.md; every registered arch maps onto one of them.
FAMILIES = ("mlp", "cnn", "transformer", "gan", "lora", "diffusion", "rnn", "gnn", "rl")


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
    progress: tuple[str, str] = ("loss", "down")  # the series a healthy run improves
    symptoms: dict[str, str] = field(default_factory=dict)  # per-arch symptom overrides
    notes: str = ""


_ARCHS: dict[str, ArchSpec] = {}


def register_arch(spec: ArchSpec) -> ArchSpec:
    """Add an architecture to the zoo (names are unique; re-registering replaces)."""
    if spec.family not in FAMILIES:
        raise ValueError(f"unknown family {spec.family!r}; valid: {', '.join(FAMILIES)}")
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
    """The API.md family of ``arch`` (e.g. ``dcgan -> gan``, ``compiled -> mlp``)."""
    return get_arch(arch).family


def default_config(arch: str, **overrides: Any) -> Any:
    """The healthy config of ``arch``, with ``overrides`` applied."""
    return replace(get_arch(arch).config(), **overrides)


# ----------------------------------------------------------------------------------------
# results


@dataclass
class RunResult:
    """What one run leaves: the loss curve, its ground truth and extra signals.

    ``losses`` has one float per step (NaN/inf kept as they happened). ``signals`` maps a
    name to ``[(step, value), ...]`` for measurements taken on some steps (task-A loss for
    LoRA, policy entropy and episode return for RL, sample distance for the GAN...).
    ``onset`` is the step the fault actually took effect (the nominal one if it never
    fired); ``wall_time`` is the training loop only (setup such as LoRA pre-training is in
    ``setup_time``), so monitored and bare runs compare fairly.
    """

    arch: str
    family: str
    injection: str
    seed: int
    truth: tuple[str, str] | None
    onset: int | None
    layer: str | None
    losses: list[float]
    steps: int
    wall_time: float
    dbg: Any = None
    signals: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    setup_time: float = 0.0
    first_step_time: float = 0.0  # part of wall_time; holds the compile for ``compiled``
    progress: tuple[str, str] = ("loss", "down")
    symptom: str = "none"

    def series(self, name: str = "loss") -> list[float]:
        """Values of ``loss`` (every step) or of a signal (its measured steps)."""
        if name == "loss":
            return list(self.losses)
        return [v for _, v in self.signals.get(name, [])]

    @property
    def first_nonfinite_step(self) -> int | None:
        """First step whose loss is NaN or infinite, or ``None``."""
        return next((i for i, v in enumerate(self.losses) if not math.isfinite(v)), None)

    def frame(self):
        """The run as a ``pandas.DataFrame``: one row per step, loss and signal columns."""
        import pandas as pd

        df = pd.DataFrame({"step": range(len(self.losses)), "loss": self.losses})
        for name, pts in self.signals.items():
            col = dict(pts)
            df[name] = [col.get(s, math.nan) for s in df["step"]]
        return df


# ----------------------------------------------------------------------------------------
# the runner


@contextlib.contextmanager
def _scoped(seed: int, threads: int | None) -> Iterator[None]:
    """Seed torch inside a forked RNG (restored on exit) and optionally pin threads."""
    old_threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            if threads is not None:
                torch.set_num_threads(old_threads)


def _make_monitor(monitor: Any, trainer: Trainer, fam: str):
    """``None`` for no monitor, else a ``NeuralDbg`` on ``trainer.model`` (lazy import)."""
    if monitor is None or monitor is False:
        return None
    from neuraldbg import NeuralDbg  # lazy: the zoo runs without the monitor

    kwargs = {} if monitor is True else dict(monitor)
    kwargs.setdefault("family", fam)
    kwargs.setdefault("optimizer", trainer.optimizer)
    return NeuralDbg(trainer.model, **kwargs)


def _as_float(v: Any) -> float:
    return float(v.detach().float().item()) if isinstance(v, torch.Tensor) else float(v)


def run(
    arch: str,
    injection: "str | Injection" = "healthy",
    seed: int = 0,
    steps: int | None = None,
    monitor: Any = None,
    *,
    threads: int | None = None,
    config: dict[str, Any] | None = None,
) -> RunResult:
    """Train ``arch`` with ``injection`` under ``seed`` and return a :class:`RunResult`.

    ``steps=None`` uses the architecture's default; onsets scale with ``steps``.
    ``monitor``: ``None``/``False`` for a bare run, ``True`` or a dict of ``NeuralDbg``
    keyword arguments to train inside ``with NeuralDbg(model, ...) as dbg`` (``family``
    defaults to the arch's family, ``optimizer`` to its main optimizer). ``threads``
    temporarily sets torch's intra-op threads; ``config`` overrides healthy config fields.
    """
    from models.injections import get_injection

    spec = get_arch(arch)
    inj = get_injection(arch, injection)
    cfg = spec.config()
    if config:
        cfg = replace(cfg, **config)
    if steps is not None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        cfg = replace(cfg, steps=int(steps))
    inj = inj.bind(spec, cfg.steps)
    cfg = inj.apply_config(cfg)

    losses: list[torch.Tensor] = []
    raw_signals: dict[str, list[tuple[int, Any]]] = {}
    dbg = None
    with _scoped(seed, threads):
        t_setup = time.perf_counter()
        trainer = spec.trainer(cfg, seed, inj)
        setup_time = time.perf_counter() - t_setup
        dbg = _make_monitor(monitor, trainer, spec.family)
        with dbg if dbg is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            first_step_time = 0.0
            trainer.start()
            for step in range(cfg.steps):
                trainer.step = step
                if dbg is not None:
                    dbg.step = step
                loss = trainer.forward_backward(step)
                if dbg is not None:
                    dbg.record_loss(loss)
                trainer.optimizer_step(step)
                # keep tensors: no device sync per step (the monitor's rule applies here too)
                losses.append(loss.detach())
                for name, value in trainer.signals(step).items():
                    raw_signals.setdefault(name, []).append((step, value))
                if step == 0:  # includes torch.compile's compilation for ``compiled``
                    first_step_time = time.perf_counter() - t0
            wall_time = time.perf_counter() - t0
        metrics = {k: float(v) for k, v in trainer.summary().items()}

    loss_list = torch.stack(losses).float().tolist() if losses else []
    signals = {n: [(s, _as_float(v)) for s, v in pts] for n, pts in raw_signals.items()}
    fired = inj.fired_step
    logger.debug("run %s/%s seed=%d: %d steps in %.2fs", arch, inj.name, seed, cfg.steps, wall_time)
    return RunResult(
        arch=arch,
        family=spec.family,
        injection=inj.name,
        seed=seed,
        truth=inj.truth,
        onset=fired if fired is not None else inj.onset,
        layer=inj.layer,
        losses=loss_list,
        steps=cfg.steps,
        wall_time=wall_time,
        dbg=dbg,
        signals=signals,
        metrics=metrics,
        setup_time=setup_time,
        first_step_time=first_step_time,
        progress=spec.progress,
        symptom=inj.symptom,
    )


# ----------------------------------------------------------------------------------------
# small helpers the architecture files share


def scale_weights(module: nn.Module, gain: float) -> None:
    """Multiply every weight matrix/kernel (``dim >= 2``) by ``gain``: the init faults."""
    if gain == 1.0:
        return
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() >= 2:
                p.mul_(gain)


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
