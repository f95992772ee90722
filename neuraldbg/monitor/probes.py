"""Root-cause signatures measured on the device: initial weight scale and step size.

Both are direct witnesses of a root cause (``docs/causal_model.md``): the weights' RMS
against the reference scale of their type and fan-in witnesses the *initialization*; the
update-to-weight ratio ``||w_after - w_before|| / ||w_before||`` witnesses the *step size*
the learning rate produced. Pure functions of tensors here, plus :class:`StepSizeProbe`, which
holds the optimizer hooks and keeps its running peak on the device (no host sync per step).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterable

import torch
from torch import nn

#: the std of transformer libraries' ``initializer_range`` convention (GPT-2, BERT, ViT, Llama)
TRANSFORMER_STD = 0.02


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


def config_init_range(root: nn.Module) -> float | None:
    """``initializer_range`` of a model config (Hugging Face style), if any module has one."""
    for m in root.modules():
        v = getattr(getattr(m, "config", None), "initializer_range", None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v)
    return None


Census = list[tuple[str, nn.Module, torch.Tensor, float]]


def weight_census(modules: Iterable[tuple[str, nn.Module]]) -> Census:
    """``(layer, module, weight, norm)`` of every floating, dense weight matrix (``dim >= 2``)
    the modules own, with all norms in one host transfer: what both the initial-scale
    signature and the step-size probe start from, measured once before training."""
    cands = [(name, mod, p) for name, mod in modules for p in mod.parameters(recurse=False)
             if p.dim() >= 2 and p.numel() > 0 and p.is_floating_point() and not p.is_sparse]
    if not cands:
        return []
    with torch.no_grad():
        dev = cands[0][2].device
        norms = torch.stack([n.float().to(dev) for n in torch._foreach_norm([p.detach() for *_, p in cands])])
        norms = norms.cpu().tolist()
    return [(name, mod, p, n) for (name, mod, p), n in zip(cands, norms)]


def init_scale(modules: Iterable[tuple[str, nn.Module]], init_range: float | None = None,
               census: Census | None = None) -> tuple[float | None, int]:
    """(median over weight matrices of the log10 factor to the nearest reference, count).

    Weight matrices that are exactly zero are zero by design (a LoRA ``B``, a zero-init output
    projection) and are left out. Pass ``census`` (:func:`weight_census`) to reuse its norms.
    """
    census = weight_census(modules) if census is None else census
    factors = sorted(nearest_log10_factor(n / math.sqrt(p.numel()), reference_stds(mod, p.shape, init_range))
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
            if pname.count(".") > ADAPTER_DEPTH or p.dim() != 2 or not p.is_floating_point() or id(p) in used:
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


def probed_weights(modules: Iterable[tuple[str, nn.Module]], census: Census | None = None) -> dict[int, str]:
    """``id(param) -> layer`` of the weight matrices the step-size probe measures: those of
    :func:`weight_census` that are not exactly zero (zero by design, like a LoRA ``B``: no
    scale for a ratio)."""
    census = weight_census(modules) if census is None else census
    return {id(p): name for name, _, p, n in census if n != 0}


def last_out_features(order: Iterable[str], modules: dict[str, nn.Module]) -> int | None:
    """``out_features`` of the last linear layer in forward order: the model's output size."""
    for name in reversed(list(order)):
        k = getattr(modules.get(name), "out_features", None)
        if isinstance(k, int) and not isinstance(k, bool):
            return k
    return None


def layer_ratios(before: list[torch.Tensor], after: list[torch.Tensor], layer_index: torch.Tensor,
                 n_layers: int) -> torch.Tensor:
    """Per-layer ``||after - before|| / ||before||`` (NaN for layers whose weights are zero).

    ``layer_index[i]`` is the layer of tensor ``i``; every norm is taken by foreach kernels and
    grouped with one ``index_add``, so the cost does not grow with Python work per tensor.
    """
    delta = torch._foreach_sub(after, before)
    dn = torch.stack(torch._foreach_norm(delta)).float()
    wn = torch.stack(torch._foreach_norm(before)).float()
    dsq = torch.zeros(n_layers, device=dn.device).index_add_(0, layer_index, dn * dn)
    wsq = torch.zeros(n_layers, device=dn.device).index_add_(0, layer_index, wn * wn)
    nan = torch.full_like(wsq, math.nan)
    return torch.where(wsq > 0, (dsq / torch.where(wsq > 0, wsq, torch.ones_like(wsq))).sqrt(), nan)


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """An index tensor on ``device`` without a blocking copy (a pinned, asynchronous one on
    CUDA), so that the training loop never waits for the device."""
    t = torch.tensor(values)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class StepSizeProbe:
    """Optimizer step pre/post hooks measuring the update-to-weight ratio on checked steps.

    Only the weight matrices in ``owner`` are measured (see :func:`probed_weights`): a bias or a
    weight that starts at zero has no scale to be relative to, and its first updates read as
    "infinitely large" whatever the learning rate.

    The pre-hook copies the parameters that have a gradient (only when ``checked()`` says the
    step is checked: unchecked steps copy nothing); the post-hook turns the difference into
    per-layer ratios and keeps their median and maximum over layers, on the device, with the
    learning rate of that step. Only the first :attr:`WINDOW` measured steps are kept: the
    step size the learning rate sets shows from the first updates on, and a fault that strikes
    later (a bad batch blowing the weights up) must not read as a learning-rate signature.
    Updates scale with the learning rate (SGD and Adam alike), so each ratio is divided by its
    step's learning rate and the result is read at the run's peak learning rate: a warm-up
    does not make a healthy run look slow. :meth:`summary` reads them once.
    """

    #: measured optimizer steps kept (memory and copies stay bounded on long runs)
    WINDOW = 16

    def __init__(self, optimizer: Any, owner: dict[int, str], checked: Callable[[], bool]) -> None:
        self.optimizer = optimizer
        self.owner = owner          # id(param) -> layer name, for the weight matrices measured
        self.checked = checked
        self._before: list[torch.Tensor] | None = None
        self._params: list[torch.Tensor] = []
        self._index: torch.Tensor | None = None
        self._n_layers = 0
        self._values: list[torch.Tensor] = []   # per measured step: (median, max) over layers
        self._lrs: list[float | None] = []       # the learning rate of each measured step
        self._lr_now: float | None = None
        self.lr_peak: float | None = None        # over every checked step, not only the window
        self.handles = [optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post)]

    @property
    def n_steps(self) -> int:
        """Optimizer steps measured so far."""
        return len(self._values)

    def remove(self) -> None:
        """Remove both hooks."""
        for h in self.handles:
            h.remove()
        self.handles = []

    def _read_lr(self, optimizer: Any) -> float | None:
        # a tensor learning rate is skipped: reading it would sync
        lrs = [float(g["lr"]) for g in optimizer.param_groups if isinstance(g.get("lr"), (int, float))]
        return max(lrs) if lrs else None

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._before = None
        if not self.checked():
            return
        lr = self._lr_now = self._read_lr(optimizer)
        if lr is not None:
            self.lr_peak = lr if self.lr_peak is None else max(self.lr_peak, lr)
        if len(self._values) >= self.WINDOW or lr == 0.0:
            return  # a zero learning rate (the first step of a warm-up) moves nothing to measure
        params = [p for g in optimizer.param_groups for p in g["params"]
                  if p.grad is not None and id(p) in self.owner]
        if not params:
            return
        if [id(p) for p in params] != [id(p) for p in self._params]:
            names = sorted({self.owner[id(p)] for p in params})
            pos = {n: i for i, n in enumerate(names)}
            self._params, self._n_layers = params, len(names)
            self._index = _to_device([pos[self.owner[id(p)]] for p in params], params[0].device)
        with torch.no_grad():
            self._before = torch._foreach_mul([p.detach() for p in params], 1.0)

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        before, self._before = self._before, None
        if before is None:
            return
        with torch.no_grad():
            ratios = layer_ratios(before, [p.detach() for p in self._params], self._index, self._n_layers)
            # NaN-aware on the device: a layer with zero weights has no ratio, and masking it
            # out with boolean indexing would sync
            top = torch.nan_to_num(ratios, nan=-1.0).max()
            self._values.append(torch.stack((torch.nanmedian(ratios), top)))
        self._lrs.append(self._lr_now)

    def summary(self) -> dict[str, float]:
        """``step_ratio_peak`` (per-step median over layers) and ``step_ratio_max`` (the fastest
        layer), each the median over the window of ``ratio / lr`` read at the peak learning rate
        (the plain median of ratios when the learning rate is unknown); one host transfer."""
        if not self._values:
            return {}
        rows = torch.stack(self._values).cpu().tolist()
        out = {"step_ratio_steps": float(len(rows))}
        known = self.lr_peak is not None and all(lr is not None and lr > 0 for lr in self._lrs)
        for col, key in ((0, "step_ratio_peak"), (1, "step_ratio_max")):
            vals = [(r[col] / lr * self.lr_peak if known else r[col]) for r, lr in zip(rows, self._lrs)
                    if math.isfinite(r[col]) and r[col] >= 0]
            if vals:
                vals.sort()
                out[key] = vals[len(vals) // 2]
        return out


class Witnesses:
    """The root causes' own witnesses for one monitor (``docs/causal_model.md``): the weights
    as training finds them (:meth:`measure`, on entry), the step-size probe on the optimizer
    (:meth:`attach`), and their numbers for the trace (:meth:`summary`)."""

    def __init__(self) -> None:
        self.census: Census | None = None  # the weight matrices and their norms on entry
        self.init_scale: tuple[float | None, int] = (None, 0)
        self.adapter_scale: tuple[float | None, int] = (None, 0)
        self.step_probe: StepSizeProbe | None = None

    def measure(self, modules: list[tuple[str, nn.Module]], root: nn.Module) -> None:
        """Initial weight scale and adapters' starting size: one host transfer, before the
        first update."""
        self.census = weight_census(modules)
        self.init_scale = init_scale(modules, config_init_range(root), census=self.census)
        self.adapter_scale = adapter_scale(root)

    def attach(self, optimizer: Any, modules: list[tuple[str, nn.Module]], checked: Callable[[], bool],
               report: Callable[..., None]) -> None:
        """Hook the step-size probe on ``optimizer`` (``report`` says why not, once)."""
        if optimizer is None:
            return
        if not (hasattr(optimizer, "register_step_pre_hook") and hasattr(optimizer, "param_groups")):
            report(("step_probe",), f"optimizer {type(optimizer).__name__} has no step hooks; the step "
                   "size is not measured", level=logging.INFO)
            return
        owner = probed_weights(modules, census=self.census)
        if owner:
            self.step_probe = StepSizeProbe(optimizer, owner, checked)

    def remove(self) -> None:
        """Remove the probe's optimizer hooks."""
        if self.step_probe is not None:
            self.step_probe.remove()

    def summary(self) -> dict[str, float]:
        """``init_scale_log10``/``_n``, ``adapter_ratio``/``_n``, the probe's ratios and
        ``lr_peak`` (one host transfer)."""
        out: dict[str, float] = {}
        f, n = self.init_scale
        if f is not None:
            out["init_scale_log10"], out["init_scale_n"] = f, n
        r, n = self.adapter_scale
        if r is not None:
            out["adapter_ratio"], out["adapter_n"] = r, n
        probe = self.step_probe
        if probe is not None:
            out.update(probe.summary())
            if probe.lr_peak is not None:
                out["lr_peak"] = probe.lr_peak
        return out
