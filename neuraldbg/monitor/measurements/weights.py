"""The weights as training finds them: their scale against sane initializations, and adapters' start.

Both are signatures of the ``initialization`` root cause (``docs/causal_model.md``): the
weights' RMS against the reference scale of their type and fan-in (:class:`InitScale`), and for
low-rank adapters how much of the frozen layer they rewrite before any update
(:class:`AdapterScale`: LoRA starts at ``B = 0``). Measured once, on entry, from the monitor's
weight census (every dense weight matrix and its norm, one host transfer). Pure functions of
tensors first, then the two measurements.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch import nn

from neuraldbg.causal.nodes.causes import (ADAPTER_N, ADAPTER_RATIO, CONFIG_INIT_RANGE, CONFIG_RANGE_CONVENTION,
                                           CONFIG_RANGE_FACTOR,
                                           INIT_SCALE_LOG10, INIT_SCALE_N, TRAINED_START)
from neuraldbg.causal.nodes.run import STARTED_TRAINED
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.measurements.output import last_out_features
from neuraldbg.monitor.settings import not_at_init
from neuraldbg.monitor.stats import is_plain, local, local_numel, measurable

#: the std of transformer libraries' ``initializer_range`` convention (GPT-2, BERT, ViT, Llama)
TRANSFORMER_STD = CONFIG_RANGE_CONVENTION


#: steps after the first optimizer step heard within which an optimizer found with state is read as
#: a resumed run: every optimizer of a loop steps in its first steps (after a gradient accumulation
#: of up to this many micro-batches, without ``dbg.step``)
FOUND_WITHIN = 64

def fans(shape: torch.Size) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight of ``shape``, as ``torch.nn.init`` computes them."""
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return int(shape[1]) * receptive, int(shape[0]) * receptive


def reference_stds(module: nn.Module, shape: torch.Size, init_range: float | None = None) -> tuple[float, ...]:
    """The weight stds a sane initialization of this layer would give.

    PyTorch's default kaiming-uniform with ``a = sqrt(5)`` (std ``1/sqrt(3 fan_in)``), LeCun
    (``1/sqrt(fan_in)``, also orthogonal rows), Kaiming (``sqrt(2/fan_in)``), Xavier
    (``sqrt(2/(fan_in+fan_out))``) and the transformer libraries' std 0.02 (or the model
    config's ``initializer_range``); embeddings default to N(0, 1).
    """
    extra = (TRANSFORMER_STD,) + ((init_range,) if init_range and init_range > 0 else ())
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) or type(module).__name__.endswith("Embedding"):
        return (1.0,) + extra
    fan_in, fan_out = fans(shape)
    return (1 / math.sqrt(3 * fan_in), 1 / math.sqrt(fan_in), math.sqrt(2 / fan_in),
            math.sqrt(2 / (fan_in + fan_out))) + extra


def nearest_log10_factor(rms: float, refs: Iterable[float]) -> float:
    """``log10(rms / ref)`` for the reference ``ref`` nearest to ``rms`` in log space."""
    logs = [math.log10(rms / r) for r in refs if r > 0]
    return min(logs, key=abs)


def config_init_range(root: nn.Module, trusted: bool = True) -> float | None:
    """``initializer_range`` of a model config (Hugging Face style), if any module has one.

    With ``trusted`` (the default) only a value within :data:`CONFIG_RANGE_FACTOR` of the
    libraries' convention :data:`TRANSFORMER_STD` (:func:`range_trusted`): the config may itself
    hold the fault, and a reference read from it would call the faulty weights normal."""
    for m in root.modules():
        v = getattr(getattr(m, "config", None), "initializer_range", None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v) if not trusted or range_trusted(float(v)) else None
    return None


def range_trusted(value: float) -> bool:
    """Whether a config's ``initializer_range`` is within :data:`CONFIG_RANGE_FACTOR` of the
    libraries' convention :data:`TRANSFORMER_STD` (0.002..0.2). Pure."""
    return value > 0 and abs(math.log10(value / TRANSFORMER_STD)) <= math.log10(CONFIG_RANGE_FACTOR)


Census = list[tuple[str, nn.Module, torch.Tensor, float]]


def weight_census(modules: Iterable[tuple[str, nn.Module]]) -> Census:
    """``(layer, module, weight, norm)`` of every floating, dense weight matrix (``dim >= 2``)
    the modules own, with all norms in one host transfer: what both the initial-scale
    signature and the step-size probe start from, measured once before training.

    A sharded weight (FSDP2 ``DTensor``) is measured on this rank's shard: ``norm`` is the
    shard's, to be read with :func:`~neuraldbg.monitor.stats.local_numel` elements. Both readers
    need only an intensive quantity (the RMS against a reference std, an update-to-weight
    ratio), which a shard of many i.i.d. entries gives as well as the whole tensor, so no
    collective is issued on entry (it would hang a job whose other ranks run no monitor). A
    weight whose shard is empty on this rank is left to the ranks that hold it."""
    cands = [(name, mod, p) for name, mod in modules for p in mod.parameters(recurse=False)
             if p.dim() >= 2 and p.is_floating_point() and not p.is_sparse and measurable(p) and local_numel(p) > 0]
    if not cands:
        return []
    with torch.no_grad():
        dev = local(cands[0][2]).device
        norms = torch.stack([n.float().to(dev) for n in torch._foreach_norm([local(p).detach() for *_, p in cands])])
        norms = norms.cpu().tolist()
    return [(name, mod, p, n) for (name, mod, p), n in zip(cands, norms)]


def init_scale(modules: Iterable[tuple[str, nn.Module]], init_range: float | None = None,
               census: Census | None = None) -> tuple[float | None, int]:
    """(median over weight matrices of the log10 factor to the nearest reference, count).

    Weight matrices that are exactly zero are zero by design (a LoRA ``B``, a zero-init output
    projection) and are left out. Pass ``census`` (:func:`weight_census`) to reuse its norms.
    """
    census = weight_census(modules) if census is None else census
    # the norm and the element count are both the shard's for a sharded weight (weight_census);
    # the reference std reads the whole shape (its fan-in)
    factors = sorted(nearest_log10_factor(n / math.sqrt(local_numel(p)), reference_stds(mod, p.shape, init_range))
                     for _, mod, p, n in census if n > 0 and math.isfinite(n))
    if not factors:
        return None, 0
    return factors[len(factors) // 2], len(factors)


#: how deep below a module an adapter's parts may sit (PEFT: ``lora_A.default.weight``)
ADAPTER_DEPTH = 2


def low_rank_adapters(root: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(module, W, A, B)`` of every low-rank adapter in ``root``, found by structure alone.

    An adapter is a module whose parameters (its own and those of sub-modules at most
    :data:`ADAPTER_DEPTH` levels down) hold a *frozen* weight ``W`` of shape ``(out, in)`` and
    *trainable* ``A`` ``(r, in)`` and ``B`` ``(out, r)`` with ``r < min(out, in)``: the layer
    computes ``W x + s B A x``. That is LoRA as PEFT and hand-written code lay it out,
    whatever the attribute names. The innermost module that holds a triple claims it.
    """
    found, used = [], set()
    for name, mod in reversed(list(root.named_modules())):  # descendants before ancestors
        frozen, trainable = [], []
        for pname, p in mod.named_parameters():
            if pname.count(".") > ADAPTER_DEPTH or p.dim() != 2 or not p.is_floating_point() or id(p) in used \
                    or not is_plain(p):
                continue
            (trainable if p.requires_grad else frozen).append(p)
        for w in frozen:
            for out_f, in_f in dict.fromkeys((tuple(w.shape), tuple(w.shape)[::-1])):  # GPT-2's Conv1D stores W^T
                a = next((p for p in trainable if p.shape[1] == in_f and p.shape[0] < min(out_f, in_f)), None)
                b = None if a is None else next(
                    (p for p in trainable if p is not a and tuple(p.shape) == (out_f, a.shape[0])), None)
                if b is not None:
                    found.append((name, w, a, b))
                    used.update((id(w), id(a), id(b)))
                    trainable = [p for p in trainable if p is not a and p is not b]
                    break
    return found


def adapter_scale(root: nn.Module) -> tuple[float | None, int]:
    """(median over low-rank adapters of ``||B A|| / ||W||``, adapter count): how large each
    adapter's update of its frozen layer starts, before the scaling factor. LoRA starts at
    ``B = 0`` (zero: fine-tuning begins at the pre-trained function); ``||B A||`` comes from
    the ``r x r`` Gram matrices, so no ``(out, in)`` product is formed. One host transfer."""
    adapters = low_rank_adapters(root)
    if not adapters:
        return None, 0
    with torch.no_grad():
        vals = []
        for _, w, a, b in adapters:
            a, b, w = a.detach().float(), b.detach().float(), w.detach().float()
            ba_sq = ((b.T @ b) * (a @ a.T)).sum().clamp_min(0)  # ||BA||_F^2 = <B^T B, A A^T>
            vals.append(ba_sq.sqrt() / w.norm().clamp_min(1e-30))
        ratios = sorted(torch.stack([v.to(vals[0].device) for v in vals]).cpu().tolist())
    ratios = [r for r in ratios if math.isfinite(r)]
    return (ratios[len(ratios) // 2], len(adapters)) if ratios else (None, len(adapters))


class _EntryWeights(Measurement):
    """A measurement of the weights as training finds them, valid only at initialization.

    A monitor entered on weights that are not at initialization measures nothing here: the
    trained weights are no evidence about the initialization (``docs/api.md``, "Coverage").
    Three signs tell it, each read only while ``at_init`` is ``None`` after the one before:

    - ``at_init=False`` or a string saying why (the framework callbacks pass "resumed from a
      checkpoint at step N" when ``fit``/``train`` resumes);
    - an optimizer that already holds state on entry or before its first step (a resumed run);
    - for the weight scale only (:class:`InitScale`), the first recorded loss far below chance
      (:func:`trained_start`): a loaded or pre-trained model under a fresh optimizer.
    """

    def __init__(self) -> None:
        self.value: tuple[float | None, int] = (None, 0)
        self.not_at_init: str | None = None
        self._seen: set[int] = set()
        self._first_heard: int | None = None
        self._retired = False  # past FOUND_WITHIN: nothing left to hear
        self._ctx: AddonContext | None = None

    def enter(self, ctx: AddonContext) -> None:
        """Measure now, unless the run is known not to start at initialization."""
        self._ctx = ctx
        self.not_at_init = not_at_init(ctx.settings.at_init)
        if self.not_at_init is None and ctx.optimizer is not None and _has_state(ctx.optimizer):
            self.not_at_init = "not at initialization: the optimizer already held state on entry (a resumed run)"
        if self.not_at_init is None:
            self.value = self.measure(ctx)

    def measure(self, ctx: AddonContext) -> tuple[float | None, int]:  # pragma: no cover - abstract
        """The value and the count, from the weights on entry."""
        raise NotImplementedError

    def optimizer_pre(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """An optimizer found later that already holds state before its first step: resumed
        (within :data:`FOUND_WITHIN` steps of the first one heard; then the hook retires)."""
        if self._retired:
            return
        if self._first_heard is None:
            self._first_heard = ctx.step
        elif ctx.step - self._first_heard >= FOUND_WITHIN:
            # an optimizer that first steps this late starts a new phase of the run: its state
            # says nothing of how the run began: no step need call this again
            ctx.hook_done(self, "optimizer_pre")
            self._retired = True
            return
        if id(optimizer) in self._seen:
            return
        self._seen.add(id(optimizer))
        if ctx.settings.at_init is None and self.not_at_init is None and _has_state(optimizer):
            self.not_at_init = (f"not at initialization: {type(optimizer).__name__} already held state before its "
                                "first step (a resumed run)")
            self.value = (None, 0)

    def reason(self) -> str | None:
        """Why the run did not start at initialization (``None``: it did, as far as is known)."""
        return self.not_at_init

    def gaps(self) -> dict[Any, str]:
        """Every signature unmeasured, when the run did not start at initialization."""
        why = self.reason()
        return {sig: why for sig in self.signatures} if why else {}


def trained_start(ctx: AddonContext) -> str | None:
    """Why the first recorded loss says the model was trained before this run, or ``None``.

    A ``K``-way classifier at initialization predicts near-uniformly, so its cross-entropy starts
    near chance level ``ln K`` (a blown-up one far above it); a first loss below
    :data:`~neuraldbg.causal.nodes.causes.TRAINED_START` of ``ln K`` means the model already knows
    its task (``docs/causal_model.md``). Read only when all of it is known: the loss is a
    cross-entropy (its graph, :func:`~neuraldbg.monitor.lossinput.is_cross_entropy`; a
    regression loss sits far below ``ln K`` at any initialization), ``K >= 2`` (the output
    size) and the first loss is finite.
    """
    first = ctx.first_loss
    if first is None or not math.isfinite(first) or ctx.loss_is_cross_entropy is not True:
        return None
    k = last_out_features(ctx.order, dict(ctx.modules))
    if k is None or k < 2:
        return None
    chance = math.log(k)
    if first >= TRAINED_START * chance:
        return None
    return (f"not at initialization: the first loss {first:.3g} is {first / chance:.2f}x chance level "
            f"ln {k} = {chance:.3g} (loaded or pre-trained weights)")


def _has_state(optimizer: Any) -> bool:
    """Whether ``optimizer`` holds per-parameter state (moments, momentum): it has stepped before."""
    try:
        return any(bool(s) for s in getattr(optimizer, "state", {}).values())
    except Exception:  # noqa: BLE001 - an optimizer-like object without a state dict
        return False


@register_measurement
class InitScale(_EntryWeights):
    """``init_scale_log10`` (the median over weight matrices of ``log10(rms / nearest reference)``)
    and ``init_scale_n``, from the census taken on entry."""

    signatures = (INIT_SCALE_LOG10, INIT_SCALE_N, STARTED_TRAINED, CONFIG_INIT_RANGE)

    def __init__(self) -> None:
        super().__init__()
        self._adapters: bool | None = None
        self._untrusted: float | None = None  # a config initializer_range far outside the convention

    def reason(self) -> str | None:
        """Why the run did not start at initialization; the first-loss sign is read here, once
        the first loss has reached the host. Not on a model with low-rank adapters: its base is
        pre-trained by design, a loss below chance says nothing of the adapters, which are the
        fine-tune's initialization (:class:`AdapterScale`), and the base's scale keeps the
        reading ``neuraldbg/causal/nodes/causes.py`` gives it (``TRAINED_START``)."""
        ctx = self._ctx
        if self.not_at_init is None and ctx is not None and ctx.settings.at_init is None:
            why = trained_start(ctx)
            if why is not None and not self._has_adapters(ctx):
                self.not_at_init, self.value = why, (None, 0)
        return self.not_at_init

    def _has_adapters(self, ctx: AddonContext) -> bool:
        if self._adapters is None:  # one walk of the model, only once the sign is met
            self._adapters = bool(low_rank_adapters(ctx.root))
        return self._adapters

    def measure(self, ctx: AddonContext) -> tuple[float | None, int]:
        """The median factor over the census' weight matrices (against a config's
        ``initializer_range`` only when it is within the libraries' convention)."""
        raw = config_init_range(ctx.root, trusted=False)
        self._untrusted = raw if raw is not None and not range_trusted(raw) else None
        return init_scale(ctx.modules, config_init_range(ctx.root), census=ctx.census)

    def summary(self) -> dict[Any, Any]:
        """The factor and the count, when any weight matrix was measured; why the run did not
        start at initialization, when it did not (one part says it for every reader: with
        ``started_trained`` no reading of the first step counts for the initialization, whose
        faulty states are then ruled out, ``neuraldbg/causal/nodes/causes.py``)."""
        why = self.reason()
        f, n = self.value
        out: dict[Any, Any] = {} if f is None else {INIT_SCALE_LOG10: f, INIT_SCALE_N: n}
        if self._untrusted is not None:
            out[CONFIG_INIT_RANGE] = self._untrusted
        if why:
            out[STARTED_TRAINED] = why
        return out

    def gaps(self) -> dict[Any, str]:
        """The scale unmeasured when the run did not start at initialization."""
        why = self.reason()
        return {sig: why for sig in (INIT_SCALE_LOG10, INIT_SCALE_N)} if why else {}


@register_measurement
class AdapterScale(_EntryWeights):
    """``adapter_ratio`` (median over low-rank adapters of ``||B A|| / ||W||`` on entry) and
    ``adapter_n``."""

    signatures = (ADAPTER_RATIO, ADAPTER_N)

    def measure(self, ctx: AddonContext) -> tuple[float | None, int]:
        """The adapters' starting size."""
        return adapter_scale(ctx.root)

    def summary(self) -> dict[Any, Any]:
        """The ratio and the count, when the model has adapters."""
        r, n = self.value
        return {} if r is None else {ADAPTER_RATIO: r, ADAPTER_N: n}
