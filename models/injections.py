"""The zoo's failure injectors with known ground truth, and their registry.

The record is :class:`neuraldbg.faults.Injection` (``models.Injection``), the fault vocabulary
the zoo, the ecosystem suite, the built-in examples and the tests share: a ``name``, the
``archs`` it applies to, the ground truth ``truth``, where (``layer``) and when (``onset``) it
enters, what the run shows (``symptom``) and the hooks the trainers call (``config``,
``model``, ``batch``, ``optimizer``).

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
import warnings
from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.registry import ArchSpec, get_arch
from neuraldbg.faults import (ONSET_FRAC, SYMPTOMS, Injection, corrupt_rows, detach_output,  # noqa: F401
                              drop_from_optimizer, rescale, softmax_output)

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
        return (corrupt_rows(batch[0], value), *batch[1:])

    return hook


def _scale_inputs(batch: tuple, step: int, inj: Injection) -> tuple:
    """Batch hook: inputs in different units from the onset on (x1000)."""
    return (rescale(batch[0]), *batch[1:])


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

# ----------------------------------------------------------------------------------------
# loop bugs (root ``training_loop``): the model, data and hyper-parameters are the healthy
# ones; the training loop around them is wrong from the first step


def _loop_layer(spec: ArchSpec) -> str | None:
    return spec.loop_layer or spec.input_layer


def _optimizers(trainer) -> list[torch.optim.Optimizer]:
    """Every optimizer the trainer holds (a GAN has two)."""
    return [v for v in vars(trainer).values() if isinstance(v, torch.optim.Optimizer)]


def _optimizer_misses_layer(trainer, inj: Injection) -> None:
    """Trainer hook: no optimizer holds the loop layer's parameters (built on a hand-picked
    subset, or before that layer was replaced)."""
    layer = trainer.model.get_submodule(inj.layer)
    if not sum(drop_from_optimizer(opt, layer) for opt in _optimizers(trainer)):
        raise ValueError(f"{inj.arch}: no optimizer holds the parameters of {inj.layer!r}")


def _detach_layer(trainer, inj: Injection) -> None:
    """Trainer hook: the loop layer's output is detached (computed under ``no_grad``)."""
    detach_output(trainer.model.get_submodule(inj.layer))


def _softmax_logits(trainer, inj: Injection) -> None:
    """Trainer hook: the model ends in a softmax, in front of the trainer's cross-entropy."""
    softmax_output(trainer.model)


#: architectures of the loop bugs: every one whose loop is a plain optimizer step (LoRA's
#: frozen base has no layer to cut out; the softmax only where a cross-entropy reads the
#: model's own output)
LOOP_ARCHS = ("mlp", "cnn", "lstm", "gnn", "transformer", "diffusion", "dcgan", "rl")
SOFTMAX_ARCHS = ("mlp", "cnn", "gnn", "transformer", "lora")
#: the GNN is left out of the stale gradients: full-batch Adam on the running sum of every
#: gradient so far learns on some seeds and not on others, so the run shows no fixed symptom
STALE_ARCHS = tuple(a for a in LOOP_ARCHS if a != "gnn") + ("lora",)

register_injection(Injection(
    name="zero_grad_missing", archs=STALE_ARCHS, truth=("training_loop", "stale_gradients"),
    symptom="worse",
    description="optimizer.zero_grad() is never called: every backward adds to the gradients of all steps before",
    why="model, data and learning rate are the healthy ones; only the loop's zero_grad is gone",
    skip_zero_grad=True,
))

register_injection(Injection(
    name="optimizer_misses_layer", archs=LOOP_ARCHS, truth=("training_loop", "params_not_in_optimizer"),
    layer_of=_loop_layer, symptom="none",
    description="the optimizer holds every parameter but those of the first layer (built on a subset, "
                "or before that layer was replaced)",
    why="the layer still gets its gradients; no optimizer applies them, so it stays at its init",
    trainer=_optimizer_misses_layer,
))

register_injection(Injection(
    name="layer_detached", archs=LOOP_ARCHS, truth=("training_loop", "graph_detached"),
    layer_of=_loop_layer, symptom="none",
    description="the first layer's output is .detach()ed (as if computed under torch.no_grad())",
    why="the layer runs and its optimizer holds it, but no gradient reaches it through the cut",
    trainer=_detach_layer,
))

register_injection(Injection(
    name="softmax_before_ce", archs=SOFTMAX_ARCHS, truth=("training_loop", "loss_on_probabilities"),
    symptom="worse",
    description="the model ends in nn.Softmax in front of CrossEntropyLoss (probabilities taken for logits)",
    why="the loss applies its own log-softmax to probabilities: its gradient shrinks and the loss "
        "cannot fall below ln(1 + (K-1)/e)",
    trainer=_softmax_logits,
))

def _broadcast_mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """MSE of a ``(B, 1)`` prediction against ``(B,)`` class ids, as written in a loop that
    regresses the ids: torch broadcasts both to ``(B, B)``."""
    with warnings.catch_warnings():
        # torch's "target size different to the input size" warning: the user's loop would show
        # it once; here it would fill the benchmark's log
        warnings.simplefilter("ignore", UserWarning)
        return F.mse_loss(out, y.float())


def _regress_class_ids(trainer, inj: Injection) -> None:
    """Trainer hook: the classifier's head gives one number, regressed on the class id by MSE
    (the optimizer rebuilt on the final model, as the user's would be)."""
    model = trainer.model
    name, head = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    one = nn.Linear(head.in_features, 1).to(head.weight.device, head.weight.dtype)
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent), attr, one)  # get_submodule("") is the model itself
    opt = trainer.optimizer
    trainer.optimizer = type(opt)(model.parameters(), **opt.defaults)
    trainer.criterion = _broadcast_mse


#: classifiers whose loop applies ``Trainer.criterion`` to ``(output, labels)``; the GNN's loop
#: does too, but its last GCN layer applies the normalized adjacency after its bias, and the
#: adjacency's rows do not sum to one: it cannot output a constant, its loss keeps falling as its
#: spread shrinks, and neither its loss nor its output shows the stall -- only its held-out
#: accuracy does, which a monitor never sees
CRITERION_ARCHS = ("mlp", "cnn")

register_injection(Injection(
    name="regression_on_class_ids", archs=CRITERION_ARCHS, truth=("unexplained", "not_learning"), symptom="no_skill",
    description="class ids regressed by MSE from a one-output head, the (B,) targets against (B, 1) predictions: "
                "torch broadcasts both to (B, B), so each prediction is scored against every target",
    why="rate, init, data, architecture and loop are the healthy ones: the loss's own shapes make the best "
        "prediction the mean class id whatever the input, so the loss stops at the targets' variance -- a "
        "cause the network does not model (the leak)",
    trainer=_regress_class_ids,
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
