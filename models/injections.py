"""Failure injectors with known ground truth, and their registry.

An :class:`Injection` is a small frozen record: a ``name``, the ``archs`` it applies to,
the ground-truth root cause ``truth`` as a ``(variable, abnormal state)`` pair of
:data:`neuraldbg.vocab.ROOTS` (``None`` for ``healthy``), where it enters (``layer``), when
(``onset``), what the run itself shows (``symptom``), and up to four hooks the trainers call:

- ``config(cfg) -> cfg``        before anything is built (learning rate, init gain, depth);
- ``model(model, cfg, trainer)`` after the model is built (e.g. install a faulty forward hook);
- ``batch(batch, step, inj) -> batch`` on every batch drawn (``batch[0]`` is the model input);
- ``optimizer(opt, step, inj)`` before every optimizer step.

Registered injections are *unbound*: ``onset_frac`` and ``layer_of`` describe them for any
arch. :meth:`Injection.bind` (done by :func:`injections` and by the runner) fixes ``arch``,
``onset`` (``round(onset_frac * steps)``) and ``layer`` for one arch and run length, and
gives the copy its own one-shot state. The same name may be registered several times for
disjoint sets of archs (e.g. ``data_shift`` scales float inputs, but remaps tokens for the
transformer); :func:`get_injection` picks the variant for the arch.

Each architecture's config says *how much* is "too high" or "too small" (``lr_high``,
``init_large``...); the general injections below only say *which* knob goes bad.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from models.registry import ArchSpec, get_arch
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
    layer_of: Callable[[ArchSpec], str | None] | str | None = None
    config: Callable[[Any], Any] | None = None
    model: Callable[[Any, Any, Any], None] | None = None
    batch: Callable[[tuple, int, "Injection"], tuple] | None = None
    optimizer: Callable[[Any, int, "Injection"], None] | None = None
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

    def bind(self, spec: ArchSpec | str, steps: int | None = None) -> "Injection":
        """A copy fixed to one arch and run length, with fresh one-shot state."""
        spec = get_arch(spec) if isinstance(spec, str) else spec
        if spec.name not in self.archs:
            raise ValueError(f"injection {self.name!r} does not apply to {spec.name!r}")
        steps = spec.config().steps if steps is None else steps
        onset = None
        if self.onset_frac is not None:
            onset = min(steps - 1, int(round(self.onset_frac * steps)))
        layer = self.layer_of(spec) if callable(self.layer_of) else self.layer_of
        symptom = spec.symptoms.get(self.name, self.symptom)
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


# ----------------------------------------------------------------------------------------
# the registry

_REGISTRY: dict[str, list[Injection]] = {}


def register_injection(inj: Injection) -> Injection:
    """Add ``inj``; a name may repeat only for disjoint ``archs`` (per-arch variants)."""
    variants = _REGISTRY.setdefault(inj.name, [])
    variants[:] = [v for v in variants if v.archs != inj.archs]  # re-registering replaces
    for v in variants:
        clash = set(v.archs) & set(inj.archs)
        if clash:
            raise ValueError(f"injection {inj.name!r} already registered for {sorted(clash)}")
    variants.append(inj)
    return inj


def extend_archs(name: str, archs: tuple[str, ...]) -> None:
    """Let registered injection ``name`` (all its variants' first one) apply to ``archs``."""
    v = _REGISTRY[name][0]
    _REGISTRY[name][0] = replace(v, archs=tuple(dict.fromkeys(v.archs + tuple(archs))))


def all_injections() -> list[Injection]:
    """Every registered (unbound) injection variant."""
    return [v for vs in _REGISTRY.values() for v in vs]


def injection_names(arch: str) -> list[str]:
    """Names of the injections that apply to ``arch`` (``healthy`` first)."""
    get_arch(arch)
    return [n for n, vs in _REGISTRY.items() if any(arch in v.archs for v in vs)]


def injections(arch: str) -> list[Injection]:
    """The injections of ``arch``, bound to its default run length (``healthy`` first)."""
    spec = get_arch(arch)
    out = []
    for vs in _REGISTRY.values():
        for v in vs:
            if arch in v.archs:
                out.append(v.bind(spec))
    return out


def get_injection(arch: str, injection: "str | Injection") -> Injection:
    """Resolve ``injection`` (a name or an Injection) for ``arch``; ``ValueError`` if invalid."""
    get_arch(arch)
    if isinstance(injection, Injection):
        if arch not in injection.archs:
            raise ValueError(f"injection {injection.name!r} does not apply to {arch!r}")
        return injection
    for v in _REGISTRY.get(injection, []):
        if arch in v.archs:
            return v
    raise ValueError(
        f"unknown injection {injection!r} for {arch!r}; valid: {', '.join(injection_names(arch))}"
    )


# ----------------------------------------------------------------------------------------
# general injections (archs are added by each architecture file via extend_archs)


def _input_layer(spec: ArchSpec) -> str | None:
    return spec.input_layer


def _unstable_layer(spec: ArchSpec) -> str | None:
    return spec.unstable_layer


def _corrupt_rows(value: float) -> Callable[[tuple, int, Injection], tuple]:
    """Batch hook: fill the first quarter of the input's samples with ``value``."""

    def hook(batch: tuple, step: int, inj: Injection) -> tuple:
        x = batch[0].clone()
        n = max(1, x.shape[0] // 4)
        x[:n] = value
        return (x, *batch[1:])

    return hook


def _scale_inputs(batch: tuple, step: int, inj: Injection) -> tuple:
    """Batch hook: inputs in different units from the onset on (x1000)."""
    return (batch[0] * 1000.0, *batch[1:])


HEALTHY = register_injection(Injection(
    name="healthy", archs=(), truth=None, onset_frac=None, symptom="none",
    description="the default config: it learns",
    why="no fault: every root cause is ok",
))

register_injection(Injection(
    name="lr_too_high", archs=(), truth=("learning_rate", "too_high"), symptom="diverges",
    description="learning rate set to the arch's lr_high (10-1000x the healthy one) from step 0",
    why="only the step size changed; the model, init and data are the healthy ones",
    config=lambda c: replace(c, lr=c.lr_high),
))

register_injection(Injection(
    name="lr_too_low", archs=(), truth=("learning_rate", "too_low"), symptom="stuck",
    description="learning rate set to the arch's lr_low (~1e-4 of the healthy one)",
    why="only the step size changed: the loss plateaus at its initial value",
    config=lambda c: replace(c, lr=c.lr_low),
))

register_injection(Injection(
    name="init_too_small", archs=(), truth=("initialization", "too_small"), symptom="stuck",
    description="every weight matrix scaled by init_small after the default init",
    why="signals shrink geometrically through the layers, so gradients vanish from step 0",
    config=lambda c: replace(c, init_gain=c.init_small),
))

register_injection(Injection(
    name="init_too_large", archs=(), truth=("initialization", "too_large"), symptom="diverges",
    description="every weight matrix scaled by init_large after the default init",
    why="activations and gradients grow geometrically with depth from step 0",
    config=lambda c: replace(c, init_gain=c.init_large),
))

register_injection(Injection(
    name="data_nan", archs=(), truth=("data", "corrupted"), symptom="nonfinite",
    onset_frac=ONSET_FRAC, layer_of=_input_layer, one_shot=True,
    description="one batch at the onset has NaN in a quarter of its inputs",
    why="the NaN enters with the batch; the model was healthy until then",
    batch=_corrupt_rows(math.nan),
))

register_injection(Injection(
    name="data_inf", archs=(), truth=("data", "corrupted"), symptom="nonfinite",
    onset_frac=ONSET_FRAC, layer_of=_input_layer, one_shot=True,
    description="one batch at the onset has +inf in a quarter of its inputs",
    why="the inf enters with the batch; the model was healthy until then",
    batch=_corrupt_rows(math.inf),
))

register_injection(Injection(
    name="data_shift", archs=(), truth=("data", "shifted"), symptom="jump",
    onset_frac=ONSET_FRAC, layer_of=_input_layer,
    description="from the onset on, inputs arrive x1000 (a units change upstream)",
    why="the inputs' distribution changes mid-run while model and optimizer stay the same",
    batch=_scale_inputs,
))

register_injection(Injection(
    name="arch_unstable", archs=(), truth=("architecture", "unstable"), symptom="stuck",
    layer_of=_unstable_layer,
    description="the arch's unstable variant (deep saturating stack, deep GNN, long recurrence)",
    why="the optimizer, init scheme and data are the healthy ones; only the architecture changed",
    config=lambda c: replace(c, unstable=True),
))


def _shuffle_labels(batch: tuple, step: int, inj: Injection) -> tuple:
    """Batch hook: the class labels permuted across the batch (rows of a token batch), so
    inputs and labels no longer match; the permutation is seeded by the step."""
    i = get_arch(inj.arch).labels_at
    y = batch[i]
    perm = torch.randperm(y.shape[0], generator=torch.Generator().manual_seed(7919 * step + 17))
    return (*batch[:i], y[perm], *batch[i + 1:])


def _nan_target(batch: tuple, step: int, inj: Injection) -> tuple:
    """Batch hook: one NaN in the float regression target; the inputs stay finite."""
    i = get_arch(inj.arch).targets_at
    y = batch[i].clone()
    y.view(-1)[-1] = math.nan  # the last entry: a burn-in window never masks it out
    return (*batch[:i], y, *batch[i + 1:])


register_injection(Injection(
    name="labels_shuffled", archs=(), truth=("data", "corrupted"), symptom="jump",
    onset_frac=ONSET_FRAC,
    description="from the onset on, the class labels are permuted across each batch",
    why="the labels stop matching the inputs mid-run (a misaligned join upstream); inputs, "
        "model and optimizer stay the healthy ones, and nothing is NaN",
    batch=_shuffle_labels,
))

register_injection(Injection(
    name="nan_target", archs=(), truth=("data", "corrupted"), symptom="nonfinite",
    onset_frac=ONSET_FRAC, one_shot=True,
    description="one batch at the onset has a NaN in its regression target",
    why="the NaN enters with the target, not the input: every monitored input is finite",
    batch=_nan_target,
))

#: data faults only archs with class labels can take (``ArchSpec.labels_at``; ``nan_target``
#: needs a float target, ``ArchSpec.targets_at``)
LABEL_FAULTS = ("labels_shuffled",)

GENERAL = ("healthy", "lr_too_high", "lr_too_low", "init_too_small", "init_too_large",
           "data_nan", "data_inf", "data_shift", "arch_unstable")


def register_general(arch: str, names: tuple[str, ...] = GENERAL) -> None:
    """Make the general injections ``names`` apply to ``arch``."""
    for n in names:
        extend_archs(n, (arch,))
