"""The fault vocabulary: one record for an injected fault, and the edits faults are made of.

An :class:`Injection` is a small frozen record: a ``name``, the ``archs`` it applies to, the
ground-truth root cause ``truth`` as a ``(variable, abnormal state)`` pair of
:data:`neuraldbg.vocab.ROOTS` (``None`` for ``healthy``), where it enters (``layer``), when
(``onset``), what the run itself shows (``symptom``), and up to four hooks a trainer calls:

- ``config(cfg) -> cfg``        before anything is built (learning rate, init gain, depth);
- ``model(model, cfg, trainer)`` after the model is built (e.g. scale the weights);
- ``batch(batch, step, inj) -> batch`` on every batch drawn (``batch[0]`` is the model input);
- ``optimizer(opt, step, inj)`` before every optimizer step;
- ``trainer(trainer, inj)``     once the trainer (model *and* optimizer) is built: loop bugs
  such as an optimizer that misses part of the model.

A loop fault may also set ``skip_zero_grad``: the trainers clear gradients through
:meth:`Injection.zero_grad`, which then never clears them (``zero_grad()`` forgotten).

Registered injections are *unbound*; :meth:`Injection.bind` fixes the architecture, the onset
and the layer for one run and gives the copy its own one-shot state. The model zoo
(``models/injections.py``: ``models.Injection`` is this class), the ecosystem suite
(``benchmarks/ecosystem/injections.py``), the built-in examples (``neuraldbg/examples.py``) and
the tests all describe their faults with it, and build them from the edits at the end.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from torch import nn

from neuraldbg.vocab import validate_truth

#: Fraction of the run at which mid-run faults fire: NeuralDBG sees a healthy warm-up first.
ONSET_FRAC = 0.4

#: What a run can show, independent of NeuralDBG (see models.symptoms).
SYMPTOMS = (
    "none",  # healthy
    "nonfinite",  # a NaN/inf loss at or after the onset
    "diverges",  # loss explodes (or goes non-finite) relative to the healthy run
    "jump",  # the loss jumps up at the onset and stays far above the healthy run
    "stuck",  # the loss barely moves where the healthy run learns
    "worse",  # learns clearly less than the healthy run
    "forgetting",  # task-A loss rises far more than in the healthy fine-tune
    "entropy_collapse",  # the policy's entropy collapses and the return does not improve
    "attention_collapse",  # attention entropy near zero, loss worse than healthy
    "no_skill",  # a loss of another kind falls, but held-out accuracy stays under half the healthy run's
)


@dataclass(frozen=True)
class Injection:
    """A failure injector; see the module docstring for the hooks and binding."""

    name: str
    archs: tuple[str, ...]
    truth: tuple[str, str] | None
    description: str
    symptom: str = "none"
    why: str = ""  # why ``truth`` is the root cause (docs/models.md)
    onset_frac: float | None = 0.0  # None: no fault; 0: from the start; else a fraction
    layer_of: Callable[[Any], str | None] | str | None = None
    config: Callable[[Any], Any] | None = None
    model: Callable[[Any, Any, Any], None] | None = None
    batch: Callable[[tuple, int, "Injection"], tuple] | None = None
    optimizer: Callable[[Any, int, "Injection"], None] | None = None
    trainer: Callable[[Any, "Injection"], None] | None = None
    skip_zero_grad: bool = False  # zero_grad() is never called (stale gradients)
    one_shot: bool = False  # batch fault fires on one batch only (the first at/after onset)
    # -- set by bind() --
    arch: str | None = None
    onset: int | None = None
    layer: str | None = None
    _state: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.truth is not None:
            try:
                validate_truth(self.truth)
            except ValueError as exc:
                raise ValueError(f"{self.name}: truth {self.truth!r} is not a fault ({exc})") from None
        if self.symptom not in SYMPTOMS:
            raise ValueError(f"{self.name}: unknown symptom {self.symptom!r}")

    # -- binding ---------------------------------------------------------------------

    def bind(self, spec: Any, steps: int | None = None, onset: int | None = None) -> "Injection":
        """A copy fixed to one architecture and run length, with fresh one-shot state.

        ``spec`` is the architecture: any object with a ``name`` (the zoo's ``ArchSpec`` also
        gives the default run length, ``config().steps``, and per-arch ``symptoms``).
        ``onset`` fixes the onset step of a fault that has one, instead of ``onset_frac x steps``.
        """
        if spec.name not in self.archs:
            raise ValueError(f"injection {self.name!r} does not apply to {spec.name!r}")
        steps = spec.config().steps if steps is None else steps
        if self.onset_frac is None:
            onset = None  # no fault, no onset
        elif onset is None:
            onset = min(steps - 1, int(round(self.onset_frac * steps)))
        layer = self.layer_of(spec) if callable(self.layer_of) else self.layer_of
        symptom = getattr(spec, "symptoms", {}).get(self.name, self.symptom)
        return replace(self, arch=spec.name, onset=onset, layer=layer, symptom=symptom)

    @property
    def fired_step(self) -> int | None:
        """The step a batch fault actually fired at (``None`` if none fired)."""
        return self._state.get("fired")

    # -- hooks the trainers call ---------------------------------------------------------

    def active(self, step: int) -> bool:
        """Whether the fault is in effect at ``step`` (from the onset on)."""
        return self.onset is not None and step >= self.onset

    def apply_config(self, cfg: Any) -> Any:
        """The config with this fault applied."""
        return self.config(cfg) if self.config else cfg

    def apply_model(self, model: Any, cfg: Any, trainer: Any = None) -> None:
        """Modify the freshly built model in place (init scaling, faulty hooks)."""
        if self.model:
            self.model(model, cfg, trainer)

    def apply_batch(self, batch: tuple, step: int) -> tuple:
        """The batch with this fault applied (``batch[0]`` is the model input)."""
        if self.batch is None or not self.active(step):
            return batch
        if self.one_shot:
            if "fired" in self._state:
                return batch
            self._state["fired"] = step
        else:
            self._state.setdefault("fired", step)
        return self.batch(batch, step, self)

    def apply_optimizer(self, optimizer: Any, step: int) -> None:
        """Adjust the optimizer before its step (e.g. an LR change at the onset)."""
        if self.optimizer:
            self.optimizer(optimizer, step, self)

    def apply_trainer(self, trainer: Any) -> None:
        """Modify the built trainer (model and optimizer) in place: the loop bugs."""
        if self.trainer:
            self.trainer(trainer, self)

    def zero_grad(self, optimizer: Any, step: int) -> None:
        """Clear ``optimizer``'s gradients as a trainer does before its backward, unless this
        fault is a forgotten ``zero_grad()`` in effect at ``step``."""
        if self.skip_zero_grad and self.active(step):
            return
        optimizer.zero_grad(set_to_none=True)


# ---- the edits faults are made of -----------------------------------------------------

#: share of a batch's samples (or entries) a corrupted batch carries
CORRUPT_FRAC = 0.25
#: factor of inputs that arrive in other units
RESCALE = 1000.0


def scale_weights(module: nn.Module, gain: float) -> None:
    """Multiply every weight matrix/kernel (``dim >= 2``) by ``gain``: the init faults."""
    if gain == 1.0:
        return
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() >= 2:
                p.mul_(gain)


def corrupt_rows(x: torch.Tensor, value: float, frac: float = CORRUPT_FRAC) -> torch.Tensor:
    """A copy of ``x`` whose first ``frac`` of samples (at least one) are ``value`` (NaN, inf)."""
    x = x.clone()
    x[:max(1, int(x.shape[0] * frac))] = value
    return x


def corrupt_entries(x: torch.Tensor, value: float, gen: torch.Generator, frac: float = CORRUPT_FRAC) -> torch.Tensor:
    """A copy of ``x`` with a random ``frac`` of its entries set to ``value`` (seeded by ``gen``)."""
    return x.masked_fill(torch.rand(x.shape, generator=gen) < frac, value)


def rescale(x: torch.Tensor, factor: float = RESCALE) -> torch.Tensor:
    """``x`` in other units: multiplied by ``factor`` (a new tensor)."""
    return x * factor


# ---- the loop bugs' edits (the ``training_loop`` faults) ---------------------------------


def drop_from_optimizer(optimizer: torch.optim.Optimizer, module: nn.Module) -> int:
    """Remove ``module``'s parameters from every param group of ``optimizer`` (built before the
    model was final, or on a hand-picked subset); returns how many parameters were dropped
    (0 when the optimizer holds none of them)."""
    ids = {id(p) for p in module.parameters()}
    dropped = 0
    for g in optimizer.param_groups:
        kept = [p for p in g["params"] if id(p) not in ids]
        dropped += len(g["params"]) - len(kept)
        g["params"] = kept
    return dropped


def _detached(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.detach()
    if isinstance(out, tuple):
        return tuple(_detached(o) for o in out)
    return out


def detach_output(module: nn.Module) -> Any:
    """Cut ``module`` from the loss: its output is ``.detach()``ed (an embedding detached, a
    feature extractor run under ``no_grad``), so its parameters never receive a gradient.
    A forward hook that returns the detached output; the handle removes it."""
    return module.register_forward_hook(lambda m, args, out: _detached(out))


def softmax_output(module: nn.Module, dim: int = -1) -> Any:
    """Make ``module`` end in ``nn.Softmax``: its logits come out as probabilities, which a
    log-softmax loss (``CrossEntropyLoss``) then treats as logits. A forward hook; the handle
    removes it."""
    return module.register_forward_hook(lambda m, args, out: torch.softmax(out, dim=dim))


def _one_wide(out: torch.Tensor) -> torch.Tensor:
    flat = out.flatten(1)
    return flat[:, :1].expand_as(flat).reshape(out.shape)


def width_one(module: nn.Module) -> Any:
    """Squeeze ``module``'s output through one unit: every feature of a sample carries the value
    of its first one, so what follows sees one number per sample (a width-1 bottleneck, such as a
    hidden size typed as 1). A forward hook; the handle removes it."""
    return module.register_forward_hook(lambda m, args, out: _one_wide(out))
