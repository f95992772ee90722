"""The ecosystem suite's faults, written against the libraries' public APIs only.

A :class:`Fault` says what goes wrong, how the ecosystem's training applies it and where it
applies; :func:`bind` turns it into the shared fault record of one arch,
:class:`neuraldbg.faults.Injection` (``models.Injection``: ``name``, ``truth``, ``onset``,
``layer``, ``symptom``). Config faults (learning rate, init, depth) act from step 0; data
faults from ``ONSET_FRAC`` of the run, so the monitor first sees healthy training. The edits
themselves (corrupting, rescaling) are the shared ones of ``neuraldbg/faults.py``.

``layer``: the first module the faulty data reaches (input faults), the first weight layer
(init faults), the first block of the deep stack; ``None`` for learning rates and for
target faults (``nan_target``, ``labels_shuffled``), which enter at the loss, not a module.

Where each applies (see ``applies``):

- ``lr_x100``, ``lr_div1e4``, ``weights_*``, ``nan_input``, ``inf_input``, ``inputs_rescaled``:
  every arch.
- ``lr_div100`` (root ``learning_rate``, too low): BERT, whose loss stays flat at chance over
  the run at 1/100 of its rate while its weights still move (a "small" step size, not "tiny").
  Token models take the input faults after their embedding (``inputs_embeds``: the
  non-finite values), or as a vocabulary remap (the shift; an LM's labels are remapped too,
  since they are the same token stream).
- ``raw_pixels``: the image model whose training it harms (``diffusers_unet``: images in 0-255
  units from step 0, the normalization forgotten). Not ``hf_vit``: its pre-norm blocks absorb the
  scale and it learns as well as healthy (a fault without effect is no failure).
- ``config_range_x100``, ``config_range_x0.01``: the HF models whose config sets their init
  (``hf_bert``, ``hf_vit``): ``initializer_range`` 2.0 / 0.0002 in the config, the weights
  then drawn from it by the library (where ``weights_*`` rescale them after construction).
  Not ``hf_llama``: its config refuses a range above 1.
- ``feature_units``: the tabular model (``torch_tabular``): one column x1000 from the onset on.
- ``nan_target``: archs with a float regression target (diffusion's noise, the LSTM).
- ``labels_shuffled``: archs with labels (classes, node blocks, next tokens: an LM's label
  rows are permuted across the batch); not ``hf_t5``, whose decoder learns the target chain from
  its own prefix whatever the encoder reads (a fault without effect).
- ``deep_unnormalized``: archs that have a deep variant (not the LoRA fine-tunes).
- ``no_warmup`` (root ``learning_rate``, too high from the first step): archs with a deep
  post-norm stack (``torch_encoder_deep``, 12 blocks), whose healthy run is its warm-up twin.
  That arch runs only ``healthy``, ``no_warmup`` and the two learning-rate faults (its list).
- the loop bugs (root ``training_loop``): ``zero_grad_missing`` on every arch;
  ``optimizer_misses_layer`` (the optimizer built without the first weight layer) on every
  arch that trains its own weights (not the LoRA fine-tunes, whose base is frozen);
  ``layer_detached`` (the first weight layer's output detached) where that layer's weight is not
  tied to an output head (not GPT-2 and Llama, not LoRA); ``softmax_before_ce`` where the
  cross-entropy reads the model's own output (the PyG models and the plain encoder; a
  ``transformers`` model computes its loss inside its forward).
- ``finetune_at_floor`` (healthy) and ``finetune_lr_x100`` (root ``learning_rate``, too high):
  the plain-torch ``torch_tabular`` and ``torch_encoder``, cheap to pre-train. The setup trains
  the model to near its floor first (its own AdamW at the recipe's rate, warm-up and cosine to
  zero over ``FLOOR_PRETRAIN`` runs' lengths, unmonitored); the monitored run then fine-tunes it
  under a fresh AdamW at the recipe's rate and schedule, or at 100x that rate. The monitor meets
  trained weights: no first-step reading may speak for the initialization, and a flat loss at the
  floor is no stall.
- the schedule and resume faults (``benchmarks/ecosystem/schedules.py``), on ``torch_tabular`` and
  ``torch_encoder``: ``scheduler_per_batch`` (root ``learning_rate``, too low; a ``StepLR`` meant
  for epochs stepped every batch, onset where the rate reaches 1e-3 of its peak: ``onset_of``);
  ``resume_without_state`` (too high, onset 0, ``torch_encoder`` only: pre-trained for three
  runs' lengths at 10x the recipe's rate (``schedules.PRETRAIN_FRAC``), resumed under a fresh
  AdamW with the cosine back at its peak)
  and its twin ``resume_with_state`` (healthy: the
  optimizer's state and the scheduler's position restored with ``load_state_dict``); and the
  healthy controls ``schedule_linear_to_zero`` and ``schedule_warm_restarts`` (SGDR). A fault's
  ``scheduler`` replaces the recipe's; the runner records the run's length in
  ``task.info["steps"]`` for setups that pre-train.
- the precision faults (root ``numerics``, ``benchmarks/ecosystem/precision.py``), on the plain-torch
  archs, each with its forward precision fixed on every seed (``autocast``), not the recipe's:
  ``fp16_weights_adam`` (``overflow``, onset 0: ``model.half()`` under the recipe's AdamW with its
  default eps, which rounds to 0 in fp16) on ``torch_tabular`` and ``torch_encoder``: on both, 86-93 %
  of the first clipped gradient's elements are under 5.5e-3, whose second moment underflows, so the
  first update is inf or NaN on every seed; ``adam_eps_zero`` (``overflow``, onset 0: AdamW(eps=0) in
  fp32, no autocast) on both: each has coordinates whose first gradient is exactly zero on every seed
  (the MLP's ReLU units dead on a whole batch; a few of the encoder's key biases, whose gradient
  softmax's shift invariance makes zero, exactly so in fp32), and those turn NaN in the first update
  (under the recipe's bf16 autocast the key biases get a rounding-level gradient instead on some
  seeds, and the encoder stays finite); ``bf16_weights_small_lr``
  (``updates_lost``: ``model.to(torch.bfloat16)`` under AdamW at ``precision.SMALL_LR``) and its twin
  ``bf16_autocast`` (healthy: fp32 weights, bf16 autocast, the same rate) on ``torch_encoder`` only,
  whose fp32 run learns clearly at that rate (loss 1.40 -> 0.88 in 120 steps) while in bf16 most of
  its updates round away (1.40 -> 1.22); not the MLP, which learns in 120 steps only from ~1e-3 on,
  where its small weights (median |w| 0.06) keep most of their updates in bf16 too (loss 0.63 against
  0.59 in fp32: a fault without effect); and ``fp16_autocast_scaler`` (healthy twin of the fp16 one:
  fp32 weights, fp16 autocast with a ``GradScaler``) on both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from benchmarks.ecosystem import precision, schedules
from benchmarks.ecosystem.training import (Batch, EcoArch, Task, adamw, cosine_lambda, train_unmonitored,
                                           warmup_steps)
from neuraldbg.faults import (ONSET_FRAC, RESCALE, Injection, corrupt_entries, detach_output,  # noqa: F401
                              drop_from_optimizer, rescale, softmax_output)


@dataclass(frozen=True)
class Fault:
    """An unbound fault: how it changes the run, and which archs it applies to."""

    name: str
    truth: tuple[str, str] | None
    description: str
    symptom: str = "none"  # what the run shows (neuraldbg.faults.SYMPTOMS)
    applies: Callable[[EcoArch], bool] = lambda a: True
    layer_of: Callable[[EcoArch], str | None] = lambda a: None
    onset_frac: float | None = 0.0  # None: healthy, 0: config fault, else a data fault
    lr_factor: float = 1.0
    gain: float = 1.0
    init_range: float = 1.0  # factor on the config's initializer_range (HF models)
    deep: bool = False
    batch: Callable[[Batch, Task, torch.Generator], Batch] | None = None
    one_shot: bool = False  # the batch fault hits one batch only
    #: a loop bug: edits the built task and its optimizer (``setup(task, layer, optimizer)``)
    setup: Callable[[Task, str | None, torch.optim.Optimizer], None] | None = None
    skip_zero_grad: bool = False  # a loop bug: optimizer.zero_grad() is never called
    warmup: bool = True  # False: the schedule starts at its peak rate (no warm-up)
    #: the schedule the run uses instead of the recipe's (``scheduler(optimizer, warmup, steps)``)
    scheduler: Callable[[torch.optim.Optimizer, int, int], object] | None = None
    #: the onset step for a run of ``steps`` where it is not ``onset_frac x steps`` (a schedule's collapse)
    onset_of: Callable[[int], int] | None = None
    #: the run's peak rate itself, where the fault fixes it instead of scaling the recipe's (``lr_factor``)
    lr: float | None = None
    #: the AdamW's ``eps`` where the fault sets it (``None``: torch's default, 1e-8)
    eps: float | None = None
    #: the weights' dtype (``model.to(dtype)`` before the optimizer is built, float inputs cast to it)
    dtype: torch.dtype | None = None
    #: how the forward runs: the recipe's autocast, or one fixed on every seed (``precision.AUTOCAST``)
    autocast: str = "recipe"


# ----------------------------------------------------------------------------------------
# batch faults: each returns a new dict and never writes into the generator's tensors


def _nonfinite(value: float):
    def corrupt(bt: Batch, task: Task, gen: torch.Generator) -> Batch:
        bt = dict(bt)
        if task.float_input:
            bt[task.float_input] = corrupt_entries(bt[task.float_input], value, gen)
        else:
            # token ids cannot hold NaN: embed them as the model would, then corrupt
            bt["inputs_embeds"] = corrupt_entries(task.embed(bt.pop(task.token_key)), value, gen)
        return bt

    return corrupt


def _nan_target(bt: Batch, task: Task, gen: torch.Generator) -> Batch:
    bt = dict(bt)
    y = bt[task.float_target].clone()
    flat = y.view(-1)
    flat[torch.randint(0, flat.numel(), (1,), generator=gen)] = float("nan")
    bt[task.float_target] = y
    return bt


def _shuffle_labels(bt: Batch, task: Task, gen: torch.Generator) -> Batch:
    bt = dict(bt)
    y = bt[task.label_key]
    bt[task.label_key] = y[torch.randperm(y.shape[0], generator=gen)]
    return bt


def _rescale(bt: Batch, task: Task, gen: torch.Generator) -> Batch:
    bt = dict(bt)
    if task.float_input:
        bt[task.float_input] = rescale(bt[task.float_input])
        return bt
    # a fixed remap of the vocabulary (token 0, the [CLS]/BOS, kept): a new "domain"
    perm = torch.cat([torch.zeros(1, dtype=torch.long),
                      1 + torch.randperm(task.vocab - 1, generator=torch.Generator().manual_seed(99))])
    bt[task.token_key] = perm[bt[task.token_key]]
    if task.token_labels:
        bt[task.label_key] = perm[bt[task.label_key]]
    return bt


#: the archs whose float input is an image (``raw_pixels``) and the tabular ones (``feature_units``)
_IMAGES = ("diffusers_unet",)
_TABULAR = ("torch_tabular",)
#: HF archs whose config's ``initializer_range`` sets their init (``config_range_*``)
_CONFIG_RANGE = ("hf_bert", "hf_vit")
#: the column ``feature_units`` rescales (an informative one of the tabular rule)
UNITS_FEATURE = 2


def _raw_pixels(bt: Batch, task: Task, gen: torch.Generator) -> Batch:
    # the inverse of the usual ``(p / 255 - 0.5) / 0.5``: the images as 0-255 pixel values
    bt = dict(bt)
    bt[task.float_input] = (bt[task.float_input] + 1.0) * 127.5
    return bt


def _feature_units(bt: Batch, task: Task, gen: torch.Generator) -> Batch:
    bt = dict(bt)
    x = bt[task.float_input].clone()
    x[..., UNITS_FEATURE] = rescale(x[..., UNITS_FEATURE])
    bt[task.float_input] = x
    return bt


def _input(a: EcoArch) -> str | None:
    return a.input_layer


def _init(a: EcoArch) -> str | None:
    return a.init_layer


def _drop_layer(task: Task, layer: str | None, opt: torch.optim.Optimizer) -> None:
    if not drop_from_optimizer(opt, task.model.get_submodule(layer or "")):
        raise ValueError(f"the optimizer holds no parameter of {layer!r}")


def _detach_layer(task: Task, layer: str | None, opt: torch.optim.Optimizer) -> None:
    detach_output(task.model.get_submodule(layer or ""))


def _softmax(task: Task, layer: str | None, opt: torch.optim.Optimizer) -> None:
    softmax_output(task.model)


#: archs whose first weight layer is tied to an output head: detaching its output still leaves
#: the weight a gradient through the head, so the fault would not be the one named
_TIED = ("hf_gpt2", "hf_llama", "hf_t5")
#: seq2seq archs whose decoder reads its own target prefix (teacher forcing): target rows swapped
#: across the batch are still sequences of the same chain, which the decoder learns without the
#: encoder, so shuffled labels are a fault without effect (measured: loss 1.82 against 1.79)
_SELF_CONDITIONED = ("hf_t5",)
#: archs whose loss stays flat over the run at 1/100 of the rate (the step size reads "small",
#: not "tiny": the weights move, too slowly to learn)
_FLAT_AT_DIV100 = ("hf_bert",)
#: archs with a deep post-norm stack (12 blocks or more), where a missing warm-up is a fault
_DEEP_POSTNORM = ("torch_encoder_deep",)
_CE_ON_OUTPUT = ("pyg_gcn", "pyg_gat", "pyg_sage", "torch_encoder")
#: archs of the schedule and resume faults: the plain-torch ones, fast enough to pre-train a
#: resume, and built with the recipe's own scheduler (no arch-specific one to replace)
_SCHEDULE_ARCHS = ("torch_tabular", "torch_encoder")
#: archs of the resume faults: where a fresh optimizer at the peak throws the trained model off its
#: floor (the encoder at 1e-2 from 0.004 to 0.25-0.54 within 15 steps, its restored twin at 0.002-0.009
#: but for one-batch spikes); the tabular task's label noise holds its floor at 0.2-0.3, where neither
#: shows (a fault without effect)
_RESUME_ARCHS = ("torch_encoder",)
#: archs of the fine-tunes of a model trained to its floor: plain torch, cheap to pre-train for
#: several runs' length
_FINETUNE_ARCHS = ("torch_tabular", "torch_encoder")
#: pre-training before a fine-tune at its floor, in monitored runs' lengths
FLOOR_PRETRAIN = 3
#: archs of the fp16 and eps=0 faults: on both, the first update divides by zero on every seed
_OVERFLOW_ARCHS = ("torch_tabular", "torch_encoder")
#: archs of the bf16 faults: where the fp32 run learns clearly at a rate whose updates bf16 rounds
#: away (the MLP learns in its 120 steps only at rates its small weights keep in bf16)
_UPDATES_LOST_ARCHS = ("torch_encoder",)


def _pretrain_to_floor(task: Task, layer: str | None, opt: torch.optim.Optimizer) -> None:
    """Train ``task.model`` to near its floor before the monitored fine-tune: its own AdamW at
    the recipe's rate (``task.lr``, whatever ``opt``'s factor), warm-up and cosine to zero over
    ``FLOOR_PRETRAIN`` x the run's steps. ``opt``, the fine-tune's, stays fresh: its rate and
    schedule are the fault's."""
    n = FLOOR_PRETRAIN * int(task.info.get("steps", 120))
    pre = adamw(task.model, task.lr)
    train_unmonitored(task, pre, torch.optim.lr_scheduler.LambdaLR(pre, cosine_lambda(warmup_steps(n), n)), n)


FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("healthy", None, "no fault: the recipe as is", onset_frac=None),
    Fault("lr_x100", ("learning_rate", "too_high"), "base learning rate x100, schedule kept",
          lr_factor=100.0, symptom="diverges"),
    Fault("lr_div1e4", ("learning_rate", "too_low"), "base learning rate / 10^4, schedule kept",
          lr_factor=1e-4, symptom="stuck"),
    Fault("lr_div100", ("learning_rate", "too_low"),
          "base learning rate / 100, schedule kept: a BERT whose loss stays flat in the run's budget",
          applies=lambda a: a.name in _FLAT_AT_DIV100, lr_factor=1e-2, symptom="stuck"),
    Fault("weights_x100", ("initialization", "too_large"),
          "every weight matrix (dim >= 2, embeddings too) x100 after construction",
          layer_of=_init, gain=100.0, symptom="diverges"),
    Fault("weights_x1e-3", ("initialization", "too_small"),
          "every weight matrix (dim >= 2, embeddings too) x1e-3 after construction",
          layer_of=_init, gain=1e-3, symptom="stuck"),
    Fault("config_range_x100", ("initialization", "too_large"),
          "the model config's initializer_range x100 (2.0 instead of 0.02)",
          applies=lambda a: a.name in _CONFIG_RANGE, layer_of=_init, init_range=100.0, symptom="diverges"),
    Fault("config_range_x0.01", ("initialization", "too_small"),
          "the model config's initializer_range x0.01 (0.0002 instead of 0.02)",
          applies=lambda a: a.name in _CONFIG_RANGE, layer_of=_init, init_range=0.01, symptom="worse"),
    Fault("nan_input", ("data", "corrupted"),
          "one batch with NaN in a quarter of the float inputs (after the embedding for tokens)",
          layer_of=_input, onset_frac=ONSET_FRAC, batch=_nonfinite(float("nan")), one_shot=True,
          symptom="nonfinite"),
    Fault("inf_input", ("data", "corrupted"),
          "one batch with +inf in a quarter of the float inputs (after the embedding for tokens)",
          layer_of=_input, onset_frac=ONSET_FRAC, batch=_nonfinite(float("inf")), one_shot=True,
          symptom="nonfinite"),
    Fault("nan_target", ("data", "corrupted"), "one batch with a NaN in its regression target",
          applies=lambda a: a.target == "float", onset_frac=ONSET_FRAC, batch=_nan_target,
          one_shot=True, symptom="nonfinite"),
    Fault("labels_shuffled", ("data", "corrupted"),
          "labels permuted within every batch from the onset on",
          applies=lambda a: a.target in ("labels", "tokens") and a.name not in _SELF_CONDITIONED,
          onset_frac=ONSET_FRAC, batch=_shuffle_labels, symptom="jump"),
    Fault("inputs_rescaled", ("data", "shifted"),
          "from the onset on, float inputs x1000 (token models: a fixed vocabulary remap)",
          layer_of=_input, onset_frac=ONSET_FRAC, batch=_rescale, symptom="jump"),
    Fault("raw_pixels", ("data", "shifted"),
          "images fed as 0-255 pixel values from step 0 (their normalization forgotten)",
          applies=lambda a: a.name in _IMAGES, layer_of=_input, onset_frac=0.0, batch=_raw_pixels,
          symptom="worse"),
    Fault("feature_units", ("data", "shifted"),
          f"from the onset on, one tabular column (index {UNITS_FEATURE}) in other units (x1000)",
          applies=lambda a: a.name in _TABULAR, layer_of=_input, onset_frac=ONSET_FRAC, batch=_feature_units,
          symptom="jump"),
    Fault("deep_unnormalized", ("architecture", "unstable"),
          "a 16-block variant with every normalization layer replaced by nn.Identity",
          applies=lambda a: a.deep_layer is not None, layer_of=lambda a: a.deep_layer, deep=True,
          symptom="stuck"),
    Fault("no_warmup", ("learning_rate", "too_high"),
          "the schedule without its warm-up: cosine decay from the peak rate at step 0",
          applies=lambda a: a.name in _DEEP_POSTNORM, warmup=False, symptom="stuck"),
    Fault("zero_grad_missing", ("training_loop", "stale_gradients"),
          "optimizer.zero_grad() is never called: the gradients of every step add up",
          skip_zero_grad=True),
    Fault("optimizer_misses_layer", ("training_loop", "params_not_in_optimizer"),
          "the optimizer holds every trainable parameter but the first weight layer's",
          applies=lambda a: a.family != "lora", layer_of=_init, setup=_drop_layer),
    Fault("layer_detached", ("training_loop", "graph_detached"),
          "the first weight layer's output is .detach()ed (as if computed under torch.no_grad())",
          applies=lambda a: a.family != "lora" and a.name not in _TIED, layer_of=_init,
          setup=_detach_layer),
    Fault("softmax_before_ce", ("training_loop", "loss_on_probabilities"),
          "the model ends in a softmax in front of the cross-entropy",
          applies=lambda a: a.name in _CE_ON_OUTPUT, setup=_softmax, symptom="worse"),
    Fault("scheduler_per_batch", ("learning_rate", "too_low"),
          "a StepLR(step_size=n/12, gamma=0.1) written for epochs, stepped every batch: the rate is at 1e-3 of "
          "its peak after a quarter of the run",
          applies=lambda a: a.name in _SCHEDULE_ARCHS, scheduler=schedules.per_batch_step_lr,
          onset_of=schedules.collapse_onset, symptom="stuck"),
    Fault("resume_without_state", ("learning_rate", "too_high"),
          "pre-trained at 10x the recipe's rate, resumed from its weights alone: a fresh AdamW, the cosine "
          "schedule back at its peak",
          applies=lambda a: a.name in _RESUME_ARCHS, setup=schedules.resume_weights_only, warmup=False,
          lr_factor=schedules.RESUME_LR_FACTOR, symptom="worse"),
    Fault("resume_with_state", None,
          "pre-trained at 10x the recipe's rate, resumed with everything: the optimizer's state and the "
          "scheduler's position restored (load_state_dict)",
          applies=lambda a: a.name in _RESUME_ARCHS, onset_frac=None, setup=schedules.resume_everything,
          scheduler=schedules.restored_scheduler, lr_factor=schedules.RESUME_LR_FACTOR),
    Fault("schedule_linear_to_zero", None, "warm-up, then a linear decay to exactly zero at the last step",
          applies=lambda a: a.name in _SCHEDULE_ARCHS, onset_frac=None, scheduler=schedules.linear_to_zero),
    Fault("schedule_warm_restarts", None, "SGDR: CosineAnnealingWarmRestarts, cycles of a quarter of the run",
          applies=lambda a: a.name in _SCHEDULE_ARCHS, onset_frac=None, scheduler=schedules.warm_restarts),
    Fault("finetune_at_floor", None,
          "a model first trained to near its floor, then fine-tuned at the recipe's rate under a fresh AdamW",
          applies=lambda a: a.name in _FINETUNE_ARCHS, onset_frac=None, setup=_pretrain_to_floor),
    Fault("finetune_lr_x100", ("learning_rate", "too_high"),
          "a model first trained to near its floor, then fine-tuned at 100x the recipe's rate",
          applies=lambda a: a.name in _FINETUNE_ARCHS, setup=_pretrain_to_floor, lr_factor=100.0, symptom="worse"),
    Fault("fp16_weights_adam", ("numerics", "overflow"),
          "model.half() under AdamW with its default eps=1e-8, which rounds to 0 in fp16: the first update "
          "divides by a zero second moment",
          applies=lambda a: a.name in _OVERFLOW_ARCHS, dtype=torch.float16, autocast="off", symptom="nonfinite"),
    Fault("adam_eps_zero", ("numerics", "overflow"),
          "AdamW(eps=0) in fp32: coordinates whose first gradient is exactly zero get 0/0 = NaN in the first update",
          applies=lambda a: a.name in _OVERFLOW_ARCHS, eps=0.0, autocast="off", symptom="nonfinite"),
    Fault("bf16_weights_small_lr", ("numerics", "updates_lost"),
          f"model.to(torch.bfloat16) under AdamW at {precision.SMALL_LR:g}: most updates are under the weights' "
          "bf16 resolution and round away",
          applies=lambda a: a.name in _UPDATES_LOST_ARCHS, dtype=torch.bfloat16, autocast="off",
          lr=precision.SMALL_LR, symptom="stuck"),
    Fault("bf16_autocast", None,
          f"fp32 weights, the forward under bf16 autocast, AdamW at {precision.SMALL_LR:g} (mixed precision as meant)",
          applies=lambda a: a.name in _UPDATES_LOST_ARCHS, onset_frac=None, autocast="bf16", lr=precision.SMALL_LR),
    Fault("fp16_autocast_scaler", None,
          "fp32 weights, the forward under fp16 autocast, the loss scaled by a torch.amp.GradScaler",
          applies=lambda a: a.name in _OVERFLOW_ARCHS, onset_frac=None, autocast="fp16"),
]}


def faults_of(arch: EcoArch) -> list[Fault]:
    """The faults that apply to ``arch`` (``healthy`` first), among its own list if it has one."""
    return [f for f in FAULTS.values() if f.applies(arch)
            and (arch.injections is None or f.name in arch.injections)]


def bind(fault: Fault, arch: EcoArch, steps: int) -> Injection:
    """The shared record of ``fault`` on ``arch`` for a run of ``steps``."""
    inj = Injection(fault.name, (arch.name,), fault.truth, fault.description, symptom=fault.symptom,
                    onset_frac=fault.onset_frac, layer_of=fault.layer_of, one_shot=fault.one_shot)
    return inj.bind(arch, steps, onset=fault.onset_of(steps) if fault.onset_of is not None else None)
