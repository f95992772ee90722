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
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from neuraldbg.causal.nodes.loop import PROB_SHARE, PROB_SHARE_SIG, STALE_STEPS
from neuraldbg.verify.outcome import VANISHED_IMPROVEMENT, late_steps, relative_gain
from neuraldbg.verify.snapshots import floating_inputs
from neuraldbg.vocab import ROOTS

#: Learning-rate factor of ``do(learning_rate = ok)`` for each abnormal state.
LR_FACTOR = {"too_high": 0.1, "too_low": 10.0}
#: A weight matrix is re-initialized when its RMS is this many decades off every reference
#: scale, or :data:`CONVENTION_DECADES` off the model's own convention (below).
OFF_DECADES = 0.5
CONVENTION_DECADES = 1.0
#: Gradient-norm bound of ``do(architecture = ok)`` (the usual ``clip_grad_norm_`` default).
CLIP_NORM = 1.0
#: A batch is standardized only when it left the warm-up distribution: its std off by this
#: factor, or its mean off by this many warm-up stds (half the shift detector's defaults).
SHIFT_SCALE = 2.5
SHIFT_MEAN_Z = 1.5
#: Failure types a gradient clip can undo; others (vanishing, saturation, dead units) cannot.
CLIPPABLE = ("exploding_gradients", "optimizer_instability")


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


def _optimizer_hooks(ctx: Context, pre: Callable[[Any], None], post: Callable[[Any], None] | None = None
                     ) -> Callable[[], None]:
    ids = ctx.params()

    def owns(opt: Any) -> bool:
        return any(id(p) in ids for g in opt.param_groups for p in g["params"])

    handles = [register_optimizer_step_pre_hook(lambda opt, a, k: pre(opt) if owns(opt) else None)]
    if post is not None:
        handles.append(register_optimizer_step_post_hook(lambda opt, a, k: post(opt) if owns(opt) else None))
    return lambda: [h.remove() for h in handles]


# ---------------------------------------------------------------------------- learning rate

class _ScaleLR(Intervention):
    def describe(self) -> str:
        f = LR_FACTOR[self.state]
        return f"learning rate {'/' + format(1 / f, 'g') if f < 1 else 'x' + format(f, 'g')} in every param group"

    def apply(self, ctx: Context) -> Callable[[], None]:
        f = LR_FACTOR[self.state]
        saved: dict[int, list] = {}

        def pre(opt: Any) -> None:
            saved[id(opt)] = [g["lr"] for g in opt.param_groups]
            for g in opt.param_groups:
                g["lr"] = g["lr"] * f
            ctx.acted += 1

        def post(opt: Any) -> None:  # the schedule goes on from its own value
            for g, lr in zip(opt.param_groups, saved.pop(id(opt), ())):
                g["lr"] = lr

        return _optimizer_hooks(ctx, pre, post)


@register_intervention("learning_rate", "too_high")
class LowerLR(_ScaleLR):
    """Learning rate /10 from the last snapshot before the onset."""


@register_intervention("learning_rate", "too_low")
class RaiseLR(_ScaleLR):
    """Learning rate x10 from the last snapshot before the onset; untestable while the loss
    is still falling fast (a larger step then speeds up any run, stuck or not)."""

    def untestable(self, ctx: Context) -> str | None:
        start, end, onset = ctx.window
        first = next((ctx.original[t] for t in range(start, end) if t in ctx.original), None)
        late = [ctx.original[t] for t in late_steps(start, end, onset) if t in ctx.original]
        if first is None or not late:
            return None
        progress = relative_gain(first, sum(late) / len(late))
        if progress > VANISHED_IMPROVEMENT:
            return (f"the loss fell {progress:.0%} over the window: not the plateau a too-low learning "
                    "rate leaves")
        return None


# ---------------------------------------------------------------------------- initialization

def off_scale(model: nn.Module, references: Callable[[nn.Module, torch.Size], tuple]
              ) -> list[tuple[str, torch.Tensor, float, float]]:
    """``(layer, weight, log10 factor, reference std)`` of every weight matrix whose scale is
    off: more than :data:`OFF_DECADES` from every reference scale of its type and fan-in, or
    more than :data:`CONVENTION_DECADES` from the model's convention. The convention is, among
    the reference schemes (same position in the reference tuple, per tuple length), the one the
    model's matrices sit nearest to (smallest median distance): a GPT's std 0.02, PyTorch's
    default elsewhere; PyTorch's default when no matrix is near any reference. The reference
    std returned is that of the convention. Exactly-zero matrices (zero by design) and frozen
    ones are left out."""
    rows = []
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            # frozen weights (a pre-trained base under adapters) were loaded, not initialized
            if p.dim() < 2 or not p.is_floating_point() or p.is_sparse or p.numel() == 0 or not p.requires_grad:
                continue
            rms = float(p.detach().float().pow(2).mean().sqrt())
            if not (rms > 0 and math.isfinite(rms)):
                continue
            refs = tuple(r for r in references(mod, p.shape))
            rows.append((name, p, rms, refs))
    def nearest(rms: float, refs: tuple) -> float:
        return min((math.log10(rms / r) for r in refs), key=abs)

    conv: dict[int, int] = {}
    for n in {len(r) for *_, r in rows}:
        # the convention is read off the matrices near some reference: when every one is off
        # (the whole model scaled), PyTorch's default (position 0) is the reference
        group = [(rms, refs) for _, _, rms, refs in rows if len(refs) == n and abs(nearest(rms, refs)) <= OFF_DECADES]
        conv[n] = 0 if not group else min(
            range(n), key=lambda i: sorted(abs(math.log10(rms / refs[i])) for rms, refs in group)[len(group) // 2])
    out = []
    for name, p, rms, refs in rows:
        ref = refs[conv[len(refs)]]
        near, dev = nearest(rms, refs), math.log10(rms / ref)
        if abs(near) > OFF_DECADES or abs(dev) > CONVENTION_DECADES:
            out.append((name, p, dev if abs(dev) > CONVENTION_DECADES else near, ref))
    return out


class _Reinit(Intervention):
    from_start = True

    def describe(self) -> str:
        return "reference re-initialization of the layers whose initial weights are too " + \
            ("small" if self.state == "too_small" else "large")

    def _targets(self, ctx: Context) -> list[tuple[str, torch.Tensor, float, float]]:
        if ctx.references is None:
            return []
        sign = -1 if self.state == "too_small" else 1
        return [t for t in off_scale(ctx.model, ctx.references) if sign * t[2] > 0]

    def untestable(self, ctx: Context) -> str | None:
        if ctx.references is None:
            return "the monitor handed over no reference weight scales"
        if not self._targets(ctx):
            return f"no weight matrix starts {'below' if self.state == 'too_small' else 'above'} its reference scale"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        # a private generator: the replay's global RNG stream stays the original run's
        gen = torch.Generator().manual_seed(0)
        layers = []
        with torch.no_grad():
            for name, p, _, std in self._targets(ctx):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std).to(p.dtype))
                layers.append(name)
                ctx.acted += 1
        ctx.notes["layers"] = sorted(set(layers))
        return lambda: None  # the snapshot restored after the replay undoes it


@register_intervention("initialization", "too_small")
class ReinitSmall(_Reinit):
    """Weights too small: re-drawn at the reference scale from step 0."""


@register_intervention("initialization", "too_large")
class ReinitLarge(_Reinit):
    """Weights too large: re-drawn at the reference scale from step 0."""


# ---------------------------------------------------------------------------- data

def _replace_inputs(fn: Callable[[Any, torch.Tensor], torch.Tensor | None]) -> Callable:
    """A forward pre-hook applying ``fn(key, tensor)`` to every floating input (``None``: keep);
    eager under ``torch.compile`` (it reads values on the host)."""

    def hook(module: nn.Module, args: tuple, kwargs: dict):
        args, kwargs = list(args), dict(kwargs)
        changed = False
        for key, x in floating_inputs(tuple(args), kwargs):
            y = fn(key, x)
            if y is not None:
                changed = True
                if isinstance(key, int):
                    args[key] = y
                else:
                    kwargs[key] = y
        return (tuple(args), kwargs) if changed else None

    return torch.compiler.disable(hook)


@register_intervention("data", "corrupted")
class DropNonFinite(Intervention):
    """Samples with a NaN/Inf entry zeroed at the model input; an update whose gradients are
    not finite (a NaN/Inf target) skipped."""

    def describe(self) -> str:
        return "non-finite samples dropped (zeroed at the model input) and updates with non-finite gradients skipped"

    def untestable(self, ctx: Context) -> str | None:
        tr = ctx.trace
        nonfinite = tr.loss.n_nonfinite > 0 or any(e.kind in ("nan", "inf") for e in tr.events)
        return None if nonfinite else "no non-finite loss or value in the run: nothing to drop " \
            "(label faults cannot be repaired from outside the data pipeline)"

    def apply(self, ctx: Context) -> Callable[[], None]:
        def clean(key: Any, x: torch.Tensor) -> torch.Tensor | None:
            bad = ~torch.isfinite(x)
            if not bool(bad.any()):
                return None
            ctx.acted += 1
            rows = bad.reshape(x.shape[0], -1).any(1) if x.dim() > 1 else bad
            return torch.where(rows.reshape((-1,) + (1,) * (x.dim() - 1)), torch.zeros_like(x), x)

        ids = ctx.params()

        def pre(opt: Any) -> None:
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None and id(p) in ids]
            if params and not bool(torch.stack([torch.isfinite(p.grad).all() for p in params]).all()):
                for g in opt.param_groups:
                    for p in g["params"]:
                        p.grad = None  # an optimizer skips parameters without a gradient
                ctx.acted += 1

        h = ctx.model.register_forward_pre_hook(_replace_inputs(clean), with_kwargs=True)
        undo = _optimizer_hooks(ctx, pre)
        return lambda: (h.remove(), undo())


@register_intervention("data", "shifted")
class Standardize(Intervention):
    """Each floating model input that left its warm-up distribution rescaled to the warm-up
    mean and std."""

    def describe(self) -> str:
        return "inputs off their warm-up distribution standardized to its mean and std"

    def untestable(self, ctx: Context) -> str | None:
        if not ctx.input_reference:
            return "no floating model input was seen during the warm-up (token ids, or a model " \
                "whose own forward is not called): nothing to standardize"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        ref = ctx.input_reference

        def standardize(key: Any, x: torch.Tensor) -> torch.Tensor | None:
            if key not in ref:
                return None
            m0, s0 = ref[key]
            xf = x.float()
            m, s = xf.mean(), xf.std()
            if not (bool(torch.isfinite(m)) and bool(torch.isfinite(s)) and float(s) > 0):
                return None
            # a batch within the warm-up distribution is left alone: rescaling every batch a
            # little would perturb a run whose trouble is elsewhere, and a chaotic run then
            # looks "better" by chance
            ratio, z = float(s) / s0, abs(float(m) - m0) / s0
            if 1 / SHIFT_SCALE <= ratio <= SHIFT_SCALE and z <= SHIFT_MEAN_Z:
                return None
            ctx.acted += 1
            return ((xf - m) / s * s0 + m0).to(x.dtype)

        h = ctx.model.register_forward_pre_hook(_replace_inputs(standardize), with_kwargs=True)
        return h.remove


# ---------------------------------------------------------------------------- architecture

@register_intervention("architecture", "unstable")
class ClipGradients(Intervention):
    """Gradient norm clipped to 1 before every update; untestable for vanishing, saturating or
    dead-unit failures (a clip cannot undo them, and normalization is not inserted)."""

    def describe(self) -> str:
        return f"gradient norm clipped to {CLIP_NORM:g} before every update"

    def untestable(self, ctx: Context) -> str | None:
        ft = getattr(ctx.hypothesis, "failure_type", None)
        if ft not in CLIPPABLE:
            return f"a {str(ft).replace('_', ' ')} failure is not one a gradient clip can undo, " \
                "and normalization is not inserted into the model"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        ids = ctx.params()

        def pre(opt: Any) -> None:
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None and id(p) in ids]
            if params:
                torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
                ctx.acted += 1

        return _optimizer_hooks(ctx, pre)


# ---------------------------------------------------------------------------- training loop

@register_intervention("training_loop", "stale_gradients")
class ZeroGradients(Intervention):
    """Gradients set to ``None`` after every step of an optimizer stepping the model, as
    ``zero_grad()`` would."""

    from_start = True

    def describe(self) -> str:
        return "gradients zeroed after every optimizer step"

    def untestable(self, ctx: Context) -> str | None:
        stale = ctx.trace.signatures.number(STALE_STEPS)
        if not stale:
            return "no examined optimizer step ran on stale gradients: nothing to zero"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        ids = ctx.params()

        def post(opt: Any) -> None:
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) in ids and p.grad is not None:
                        p.grad = None
            ctx.acted += 1

        # the replay starts from a snapshot: leftover gradients of the run go too
        for p in ctx.model.parameters():
            p.grad = None
        return _optimizer_hooks(ctx, lambda opt: None, post)


def _missing(ctx: Context) -> list[torch.Tensor]:
    held = {id(p) for g in ctx.optimizer.param_groups for p in g["params"]} if ctx.optimizer is not None else set()
    seen: set[int] = set()
    out = []
    for p in ctx.model.parameters():
        if p.requires_grad and id(p) not in held and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


@register_intervention("training_loop", "params_not_in_optimizer")
class AddMissingParams(Intervention):
    """The trainable parameters no param group holds, stepped by a copy of the optimizer (same
    class and defaults, the first group's hyperparameters) right after each of its steps, and
    zeroed with it."""

    from_start = True

    def describe(self) -> str:
        return "the trainable parameters missing from the optimizer stepped by a copy of it"

    def untestable(self, ctx: Context) -> str | None:
        if ctx.optimizer is None or not hasattr(ctx.optimizer, "param_groups"):
            return "no torch optimizer to copy"
        if not _missing(ctx):
            return "every trainable parameter is in the optimizer's param groups"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        opt = ctx.optimizer
        group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
        missing = _missing(ctx)
        try:
            extra = type(opt)(missing, **group)
        except TypeError:  # an optimizer whose groups hold keys its constructor does not take
            extra = type(opt)(missing, **opt.defaults)
        ctx.notes["layers"] = sorted({n.rsplit(".", 1)[0] for n, p in ctx.model.named_parameters()
                                      if any(p is q for q in missing)})

        def post(o: Any) -> None:
            if o is not opt:
                return
            if any(p.grad is not None for p in missing):
                extra.step()
                ctx.acted += 1
            extra.zero_grad(set_to_none=True)

        handle = register_optimizer_step_post_hook(lambda o, a, k: post(o))
        return handle.remove


#: tolerance of the probability-row test (float rounding of a softmax)
ROW_TOL = 1e-3


def _log_if_probabilities(y: Any) -> Any:
    """``log(y)`` when ``y``'s last-dimension rows are probability vectors, else ``None``."""
    if not (isinstance(y, torch.Tensor) and y.is_floating_point() and y.dim() >= 1 and y.shape[-1] >= 2):
        return None
    with torch.no_grad():
        yd = y.detach().float()
        rows = bool(yd.amin() >= -ROW_TOL) and bool(yd.amax() <= 1 + ROW_TOL) and \
            bool((yd.sum(-1) - 1).abs().amax() <= ROW_TOL)
    # log-probabilities make a log-softmax loss compute the negative log-likelihood it meant to
    return y.clamp_min(torch.finfo(y.dtype).tiny).log() if rows else None


@register_intervention("training_loop", "loss_on_probabilities")
class LogProbabilities(Intervention):
    """The model's probability rows handed on as log-probabilities (a forward hook on the model):
    a cross-entropy over them is then the negative log-likelihood the loop meant."""

    from_start = True

    def describe(self) -> str:
        return "the model's probability output handed to the loss as log-probabilities"

    def untestable(self, ctx: Context) -> str | None:
        share = ctx.trace.signatures.number(PROB_SHARE_SIG)
        if share is None or share < PROB_SHARE:
            return "the model's output rows were not probability vectors: nothing to hand on as log-probabilities"
        return None

    def apply(self, ctx: Context) -> Callable[[], None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if isinstance(output, torch.Tensor):
                y = _log_if_probabilities(output)
                if y is not None:
                    ctx.acted += 1
                return y
            if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                y = _log_if_probabilities(output[0])
                if y is not None:
                    ctx.acted += 1
                    return (y,) + tuple(output[1:])
                return None
            logits = getattr(output, "logits", None)
            y = _log_if_probabilities(logits)
            if y is not None:
                ctx.acted += 1
                output.logits = y
                return output
            return None

        return ctx.model.register_forward_hook(torch.compiler.disable(hook)).remove
