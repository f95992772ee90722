"""Interventions ``do(cause = ok)``, one per abnormal root-cause state, and their registry.

An :class:`Intervention` says where its replay starts (:attr:`from_start`: the first
snapshot; else the last snapshot at or before the hypothesis' onset), whether it can act on
this run at all (:meth:`Intervention.untestable`, checked before any step is spent), and how
it changes training (:meth:`Intervention.apply`: install hooks, return the undo). Hooks
observe the user's own step function from outside; the step function itself is unchanged.
``docs/verification.md`` describes each one and where it cannot help.

Optimizer-side interventions use torch's global optimizer step hooks, filtered to optimizers
that update the model's parameters: a learning-rate scheduler or a ``set_lr`` call in the
step function sets the rate before the step, the hook scales it for that step only, and a
second optimizer (a GAN's discriminator) is covered too.

The registry (:func:`register_intervention`, :func:`get_intervention`), :class:`Context` and
the :class:`Intervention` base class are defined here; the interventions themselves live in
one module per root cause, named as in :data:`neuraldbg.vocab.ROOTS`:
:mod:`.learning_rate`, :mod:`.initialization`, :mod:`.data`, :mod:`.architecture` and
:mod:`.training_loop`. Importing this package imports them all, which registers them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from neuraldbg.vocab import ROOTS


@dataclass
class Context:
    """What an intervention may read and act on during one replay."""

    model: nn.Module            # the monitored module (wrappers looked through)
    optimizer: Any
    hypothesis: Any             # the Hypothesis being tested
    trace: Any                  # the original run's Trace
    references: Callable[[nn.Module, torch.Size], tuple] | None
    input_reference: dict[Any, tuple[float, float]]
    original: dict[int, float] = field(default_factory=dict)  # step -> loss of the run
    window: tuple[int, int, int] = (0, 0, 0)                  # start, end (exclusive), onset
    acted: int = 0              # how many times the intervention changed something
    notes: dict[str, Any] = field(default_factory=dict)

    def params(self) -> set[int]:
        """Ids of the model's parameters (to recognize its optimizers)."""
        return {id(p) for p in self.model.parameters()}


class Intervention:
    """Base class of ``do(cause = ok)`` for one abnormal ``(cause, state)``."""

    cause: str = ""
    state: str = ""
    #: replay from the first snapshot (the fault is in place before any update)
    from_start: bool = False

    def describe(self) -> str:
        """One phrase: what the replay changes."""
        raise NotImplementedError

    def untestable(self, ctx: Context) -> str | None:
        """Why this run gives the intervention nothing to act on (``None``: testable)."""
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        """Change training for the replay; return the function that undoes the change."""
        raise NotImplementedError


INTERVENTIONS: dict[tuple[str, str], type[Intervention]] = {}


def register_intervention(cause: str, state: str) -> Callable[[type[Intervention]], type[Intervention]]:
    """Class decorator: the intervention that tests ``cause = state`` (an abnormal root state)."""
    if cause not in ROOTS or state not in ROOTS[cause] or state == "ok":
        valid = ", ".join(f"{c}/{s}" for c, ss in ROOTS.items() for s in ss if s != "ok")
        raise ValueError(f"no abnormal root state {cause}/{state}; valid: {valid}")

    def deco(cls: type[Intervention]) -> type[Intervention]:
        cls.cause, cls.state = cause, state
        INTERVENTIONS[(cause, state)] = cls
        return cls

    return deco


def get_intervention(cause: str, state: str) -> Intervention | None:
    """A fresh intervention for ``cause = state``, ``None`` if none is registered."""
    cls = INTERVENTIONS.get((cause, state))
    return cls() if cls is not None else None


def optimizer_hooks(ctx: Context, pre: Callable[[Any], None], post: Callable[[Any], None] | None = None
                    ) -> Callable[[], None]:
    """Install ``pre(opt)`` (and ``post(opt)``) around every step of an optimizer that updates
    the model's parameters; return the function that removes them."""
    ids = ctx.params()

    def owns(opt: Any) -> bool:
        return any(id(p) in ids for g in opt.param_groups for p in g["params"])

    handles = [register_optimizer_step_pre_hook(lambda opt, a, k: pre(opt) if owns(opt) else None)]
    if post is not None:
        handles.append(register_optimizer_step_post_hook(lambda opt, a, k: post(opt) if owns(opt) else None))
    return lambda: [h.remove() for h in handles]


# The interventions register themselves when their module is imported: they come after the
# registry they register into, and every import path to any of them runs this package first.
from neuraldbg.verify.interventions.architecture import CLIP_NORM, CLIPPABLE, ClipGradients  # noqa: E402
from neuraldbg.verify.interventions.data import SHIFT_MEAN_Z, SHIFT_SCALE, DropNonFinite, Standardize  # noqa: E402
from neuraldbg.verify.interventions.initialization import (  # noqa: E402
    CONVENTION_DECADES, OFF_DECADES, ReinitLarge, ReinitSmall, off_scale)
from neuraldbg.verify.interventions.learning_rate import LR_FACTOR, LowerLR, RaiseLR  # noqa: E402
from neuraldbg.verify.interventions.training_loop import (  # noqa: E402
    ROW_TOL, AddMissingParams, LogProbabilities, ZeroGradients)

__all__ = ["CLIPPABLE", "CLIP_NORM", "CONVENTION_DECADES", "INTERVENTIONS", "LR_FACTOR", "OFF_DECADES", "ROW_TOL",
           "SHIFT_MEAN_Z", "SHIFT_SCALE", "AddMissingParams", "ClipGradients", "Context", "DropNonFinite",
           "Intervention", "LogProbabilities", "LowerLR", "RaiseLR", "ReinitLarge", "ReinitSmall", "Standardize",
           "ZeroGradients", "get_intervention", "off_scale", "optimizer_hooks", "register_intervention"]
