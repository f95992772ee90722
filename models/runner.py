"""The zoo's one runner: any registered architecture, with or without the monitor.

:func:`run` drives every architecture the same way:

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
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import torch
from torch import nn

from models.injections import Injection, get_injection
from models.registry import get_arch

__all__ = ["RunResult", "run"]

logger = logging.getLogger("neuraldbg.models")


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
    #: ``replay(model, optimizer, step) -> loss``: one training step of this run, for
    #: ``result.dbg.verify(result.replay)`` (monitor with ``snapshots=True``; docs/verification.md)
    replay: Any = None
    #: what ran otherwise than written, and why (a CPU without a kernel the run asks for, say):
    #: ``records.csv``'s ``note`` column
    notes: tuple[str, ...] = ()

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


@contextlib.contextmanager
def scoped(seed: int, threads: int | None) -> Iterator[None]:
    """Seed torch inside a forked RNG (restored on exit) and optionally pin threads.

    Every suite's runner trains inside it, so a run never changes global state for good."""
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


def make_monitor(monitor: Any, model: nn.Module, optimizer: Any, fam: str, defaults: dict[str, Any] | None = None):
    """``None`` for no monitor, else a ``NeuralDbg`` on ``model`` (lazy import).

    ``monitor`` is ``None``/``False``, ``True`` or a dict of ``NeuralDbg`` keyword arguments;
    ``family`` defaults to ``fam`` and any other argument to ``defaults`` (what the run itself
    offers: ``Trainer.monitor_defaults``). The monitor finds the optimizers itself, as it does
    for a user who passes none; ``optimizer`` is handed over only with ``snapshots``, whose
    first snapshot is taken before any optimizer has stepped (docs/verification.md)."""
    if monitor is None or monitor is False:
        return None
    from neuraldbg import NeuralDbg  # lazy: the zoo runs without the monitor

    kwargs = {**(defaults or {}), **({} if monitor is True else dict(monitor))}
    kwargs.setdefault("family", fam)
    if kwargs.get("snapshots"):
        kwargs.setdefault("optimizer", optimizer)
    return NeuralDbg(model, **kwargs)


def track_trainer(dbg: Any, trainer: Any) -> None:
    """When ``dbg`` keeps snapshots, have them carry the trainer's own state (data streams,
    environment, second optimizer...), so ``verify`` replays the very batches of the run."""
    if dbg is None:
        return
    from neuraldbg.verify.snapshots import of  # lazy: the zoo runs without the monitor

    snaps = of(dbg)
    if snaps is not None:
        snaps.track(save=trainer.replay_state, load=trainer.load_replay_state)


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
    with scoped(seed, threads):
        t_setup = time.perf_counter()
        trainer = spec.trainer(cfg, seed, inj)
        inj.apply_trainer(trainer)
        setup_time = time.perf_counter() - t_setup
        dbg = make_monitor(monitor, trainer.model, trainer.optimizer, spec.family, trainer.monitor_defaults())
        track_trainer(dbg, trainer)
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
        replay=trainer.replay,
    )
