"""The ``ecosystem`` benchmark suite: models NeuralDBG did not write, trained as people do.

Where ``models`` (the zoo) holds NeuralDBG's own reference architectures, this suite builds
library models from tiny configs with random init: ``transformers`` (GPT-2, BERT, ViT,
Llama), ``peft`` LoRA, ``torch_geometric`` (GCN, GAT, GraphSAGE), ``diffusers`` (UNet2DModel
+ DDPM) and plain ``nn.TransformerEncoder`` / ``nn.LSTM``. Nothing is downloaded: data is
generated in-process from the seed. The interface mirrors the zoo so the harness can treat
both suites alike::

    from benchmarks import ecosystem as eco
    eco.architectures()                      # ['hf_gpt2', 'hf_bert', ...]
    [i.name for i in eco.injections("pyg_gcn")]
    r = eco.run("hf_gpt2", "lr_x100", seed=0, monitor=True)
    r.losses, r.truth, r.dbg.get_causal_hypotheses()

The training recipe (:mod:`.training`) is AdamW + warm-up + cosine, ``clip_grad_norm_(1.0)``,
bf16 autocast on odd seeds and 2-micro-batch gradient accumulation on seeds 2, 3 (mod 4); a
precision fault (:mod:`.precision`) fixes its own weights' dtype and autocast on every seed.
The libraries are imported only when an arch is built: listing needs none of them.
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch

from benchmarks.ecosystem import cpu, diffusion, graph, hf, lora, plain, precision
from benchmarks.ecosystem.injections import FAULTS, Fault, Injection, bind, faults_of
from benchmarks.ecosystem.training import (CLIP_NORM, Build, EcoArch, accumulation_of, adamw, torch_scheduler,
                                           warmup_steps)

logger = logging.getLogger("neuraldbg.benchmarks.ecosystem")

_ARCHS: dict[str, EcoArch] = {a.name: a for mod in (hf, lora, graph, diffusion, plain)
                              for a in mod.ARCHS}

#: Seeds of the full suite: healthy runs, and the two of every injected run (seed 0: fp32,
#: no accumulation; seed 3: bf16 autocast with accumulation, the two ends of the recipe).
HEALTHY_SEEDS = tuple(range(9))
INJECTED_SEEDS = (0, 3)
#: The quick subset: two healthy seeds for every arch, and one seed of every injection for
#: one arch per library.
QUICK_HEALTHY_SEEDS = (3,)
QUICK_INJECTED_SEED = 3
#: Healthy seeds below which the harness also trains the unmonitored timing twin (full,
#: quick): fewer than the zoo's, to keep the full suite within 20 minutes on 2 cores.
BARE_SEEDS = (2, 0)
#: Injections run on one seed only in the full suite: 16-block stacks cost 3-5 ordinary runs.
SINGLE_SEED = ("deep_unnormalized",)
QUICK_ARCHS = ("hf_llama", "lora_gpt2", "pyg_gcn", "diffusers_unet", "torch_lstm")

__all__ = [
    "Injection", "RunResult", "architectures", "family", "get_arch", "injections", "run",
    "suite_runs",
]


def __getattr__(name: str) -> Any:
    if name == "RunResult":  # lazily: importing the zoo is not needed to list this suite
        from models import RunResult

        return RunResult
    raise AttributeError(name)


def architectures() -> list[str]:
    """The ecosystem arch names, grouped by library."""
    return list(_ARCHS)


def get_arch(arch: str) -> EcoArch:
    """The spec of ``arch``; ``ValueError`` naming the valid ones if unknown."""
    try:
        return _ARCHS[arch]
    except KeyError:
        raise ValueError(f"unknown architecture {arch!r}; valid: {', '.join(_ARCHS)}") from None


def family(arch: str) -> str:
    """The zoo family of ``arch`` (``hf_gpt2 -> transformer``, ``pyg_gcn -> gnn``...)."""
    return get_arch(arch).family


def injections(arch: str, steps: int | None = None) -> list[Injection]:
    """The injections of ``arch`` bound to a run of ``steps`` (its default), healthy first."""
    spec = get_arch(arch)
    n = spec.steps if steps is None else steps
    return [bind(f, spec, n) for f in faults_of(spec)]


def _fault(spec: EcoArch, injection: Any) -> Fault:
    name = getattr(injection, "name", injection)
    valid = [f.name for f in faults_of(spec)]
    if name not in valid:
        raise ValueError(f"unknown injection {name!r} for {spec.name!r}; valid: {', '.join(valid)}")
    return FAULTS[name]


def suite_runs(quick: bool = False) -> list[tuple[str, str, int]]:
    """The ``(arch, injection, seed)`` runs of the full suite or of its quick subset (archs with
    ``in_suite=False`` left out: they run only when named with explicit seeds)."""
    out: list[tuple[str, str, int]] = []
    for arch in _ARCHS:
        if not _ARCHS[arch].in_suite:
            continue
        names = [f.name for f in faults_of(_ARCHS[arch])]
        healthy = QUICK_HEALTHY_SEEDS if quick else HEALTHY_SEEDS
        out += [(arch, "healthy", s) for s in healthy]
        if quick and arch not in QUICK_ARCHS:
            continue
        seeds = (QUICK_INJECTED_SEED,) if quick else INJECTED_SEEDS
        out += [(arch, n, s) for n in names if n != "healthy" for s in (seeds[:1] if n in SINGLE_SEED else seeds)]
    return out


def run(arch: str, injection: Any = "healthy", seed: int = 0, steps: int | None = None,
        monitor: Any = None, *, threads: int | None = None):
    """Train ``arch`` with ``injection`` under ``seed``; return a ``models.RunResult``.

    ``injection`` is a name or an :class:`Injection`; ``steps=None`` uses the arch's
    default (onsets scale with it). ``monitor``: ``None``/``False`` for a bare run, ``True``
    or a dict of ``NeuralDbg`` keyword arguments to train inside the monitor. ``threads``
    temporarily sets torch's intra-op threads. ``wall_time`` is the training loop only.
    """
    from models import RunResult
    from models.runner import make_monitor, scoped
    from neuraldbg.faults import scale_weights

    spec = get_arch(arch)
    fault = _fault(spec, injection)
    n = spec.steps if steps is None else int(steps)
    if n < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    inj = bind(fault, spec, n)
    # the recipe's bf16 autocast on odd seeds, unless the fault fixes its own precision
    amp, accum = precision.autocast_dtype(fault.autocast, seed), accumulation_of(seed)
    bf16 = amp == torch.bfloat16

    losses: list[torch.Tensor] = []
    fired: int | None = None
    with scoped(seed, threads):
        t_setup = time.perf_counter()
        task = spec.build(Build(seed=seed, deep=fault.deep, init_range=fault.init_range))
        if fault.gain != 1.0:
            scale_weights(task.model, fault.gain)
        if fault.dtype is not None:  # as a user converts: the model first, then its optimizer
            precision.cast_weights(task, fault.dtype)
        lr = task.lr * fault.lr_factor if fault.lr is None else fault.lr
        opt = adamw(task.model, lr) if fault.eps is None else adamw(task.model, lr, eps=fault.eps)
        task.info["steps"] = float(n)  # what a setup that pre-trains (a resume) sizes itself by
        if fault.setup is not None:
            fault.setup(task, inj.layer, opt)
        sched = (fault.scheduler or task.scheduler or torch_scheduler)(opt, warmup_steps(n) if fault.warmup else 0, n)
        params = [p for p in task.model.parameters() if p.requires_grad]
        micro = max(1, task.batch_size // accum)  # same examples per optimizer step
        fault_gen = torch.Generator().manual_seed(11_000 + seed)
        scaler = precision.grad_scaler(amp)
        task.model.train()
        setup_time = time.perf_counter() - t_setup
        # a mixed-precision loop hands its GradScaler to the monitor, as its users are told to
        dbg = make_monitor(monitor, task.model, opt, spec.family,
                           defaults=None if scaler is None else {"scaler": scaler})
        # with snapshots (verification), keep each step's batches: the replay trains on them
        cached: list[list] | None = _track(dbg, sched)
        with dbg if dbg is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            first_step_time = 0.0
            for step in range(n):
                if dbg is not None:
                    dbg.step = step  # the optimizer step: micro-batches add up inside it
                if not fault.skip_zero_grad:
                    opt.zero_grad(set_to_none=True)
                micro_losses = []
                for _ in range(accum):
                    bt = task.batch(micro)
                    clean, gen_state = bt, None
                    if (fault.batch is not None and step >= inj.onset
                            and not (fault.one_shot and fired is not None)):
                        gen_state = fault_gen.get_state() if cached is not None else None
                        bt = fault.batch(bt, task, fault_gen)
                        fired = step if fired is None else fired
                    if cached is not None:  # per step: its micro-batches, before the fault
                        if len(cached) <= step:
                            cached.append([])
                        cached[step].append((clean, gen_state))
                    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                        loss = task.loss(bt)
                    _backward(loss / accum, scaler)
                    micro_losses.append(loss.detach().float())
                # one loss per optimizer step: the mean of its micro-batches (a 0-d tensor,
                # no host sync); docs/idioms.md
                step_loss = micro_losses[0] if accum == 1 else torch.stack(micro_losses).mean()
                if dbg is not None:
                    dbg.record_loss(step_loss)
                _clip_and_step(opt, params, scaler)
                sched.step()
                losses.append(step_loss)
                if step == 0:
                    first_step_time = time.perf_counter() - t0
            wall_time = time.perf_counter() - t0

    loss_list = torch.stack(losses).tolist() if losses else []
    logger.debug("run %s/%s seed=%d: %d steps in %.2fs", arch, fault.name, seed, n, wall_time)
    return RunResult(
        arch=arch, family=spec.family, injection=fault.name, seed=seed, truth=inj.truth,
        onset=fired if fired is not None else inj.onset, layer=inj.layer, losses=loss_list,
        steps=n, wall_time=wall_time, dbg=dbg, setup_time=setup_time,
        first_step_time=first_step_time,
        metrics={"bf16": float(bf16), "accumulation": float(accum),
                 "trainable_parameters": float(sum(p.numel() for p in params))},
        replay=None if cached is None else _replay(task, fault, sched, params, cached, amp, accum, scaler),
        notes=cpu.fallback_notes(task.model, bf16),
    )


def _track(dbg: Any, sched: Any) -> list | None:
    """Snapshots also carry the LR schedule; returns the batch cache, or ``None`` without snapshots."""
    from neuraldbg.verify.snapshots import of

    snaps = of(dbg) if dbg is not None else None
    if snaps is None:
        return None
    snaps.track(sched)
    return []


def _backward(loss: torch.Tensor, scaler: Any) -> None:
    """``loss.backward()``, through the GradScaler's scaling where the loop has one."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def _clip_and_step(opt: torch.optim.Optimizer, params: list, scaler: Any) -> None:
    """The recipe's clip and optimizer step; with a GradScaler, the gradients are unscaled
    before the clip (the norm is the true one) and the step is skipped where they overflowed."""
    if scaler is None:
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        opt.step()
        return
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
    scaler.step(opt)
    scaler.update()


def _replay(task: Any, fault: Fault, sched: Any, params: list, cached: list, amp: torch.dtype | None,
            accum: int, scaler: Any = None):
    """``replay(model, optimizer, step) -> loss``: the run's step ``step`` on its own batches,
    with the run's autocast (and GradScaler), accumulation, clipping and schedule
    (docs/verification.md). A batch fault is applied again from its generator state at that
    step: a token fault corrupts the embedding, which has to be computed by the model as it is now."""

    def replay(model: Any, optimizer: Any, step: int) -> torch.Tensor:
        if not fault.skip_zero_grad:
            optimizer.zero_grad(set_to_none=True)
        micro = []
        for clean, gen_state in cached[step]:
            bt = clean if gen_state is None else fault.batch(clean, task, torch.Generator().set_state(gen_state))
            with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                loss = task.loss(bt)
            _backward(loss / accum, scaler)
            micro.append(loss.detach().float())
        _clip_and_step(optimizer, params, scaler)
        sched.step()
        return micro[0] if accum == 1 else torch.stack(micro).mean()

    return replay
