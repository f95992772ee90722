"""Whether the loss is a cross-entropy, told from the gradient it sends into the model's output.

Chance level ``ln K`` is a reference only for a ``K``-way cross-entropy (``neuraldbg/causal/nodes/
run.py``). The loss's autograd graph tells (:func:`~neuraldbg.monitor.lossinput.is_cross_entropy`),
but most loops record a number or a detached tensor (``loss.item()``, ``loss.detach()``), whose
graph is gone. This witness needs no graph: a cross-entropy over softmax logits
(``F.cross_entropy``, ``nn.CrossEntropyLoss``, label smoothing and ignored targets included) sends
each output row the gradient ``w * (softmax(z) - target)``, and both terms sum to 1 over the
classes, so every row of the gradient sums to zero along the class dimension. A regression (MSE,
L1, Huber), a binary cross-entropy or a margin loss leaves no such zero: with residuals of either
sign the row sums are a sizeable share of the gradient (about ``1/sqrt(K)``).

On the first :data:`WINDOW` checked steps a tensor hook on the model's output reads, on the
device, ``min over class dimensions d of ||sum_d g||_1 / ||g||_1``; the host reads the values
once, when the loss kind is first asked for. A model whose loss is computed inside its forward
(a ``transformers`` model given labels) returns that loss: its graph is read instead.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor.lossinput import is_cross_entropy
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.records import first_tensor

#: checked steps whose output gradient is read (the loss function is the same every step: a few
#: suffice, and the hook is gone after them)
WINDOW = 4
#: a row-sum share below this (or 3 ulps of the gradient's dtype, whichever is larger) is a
#: softmax cross-entropy's zero: measured 3e-8 in float32, up to 2e-3 in float16 and 3e-3 in
#: bfloat16 (K = 2 .. 50,000); a regression's share is about 1/sqrt(K) (0.29 for K = 16, 0.036
#: for K = 1000)
ZERO_SHARE = 1e-3
#: a share above this many times ZERO_SHARE, and twice the dtype's cut, is no cross-entropy
#: (between the two: undecided, as for a regression over tens of thousands of outputs)
CLEAR_FACTOR = 10.0


def row_sum_share(grad: torch.Tensor) -> torch.Tensor:
    """``min over dims d >= 1 of ||grad.sum(d)||_1 / ||grad||_1`` as a 0-d float tensor (NaN for an
    all-zero gradient; dim 0 is the batch, read only for a 1-d gradient). Pure, on the device."""
    g = grad.detach().float()
    total = g.abs().sum()
    dims = range(1, g.dim()) if g.dim() > 1 else (0,)
    share = torch.stack([g.sum(d).abs().sum() for d in dims]).amin() / total
    return torch.where(total > 0, share, torch.full_like(share, float("nan")))


def share_cut(dtype: torch.dtype) -> float:
    """The row-sum share under which a gradient of ``dtype`` sums to zero: rounding of each entry
    to the dtype leaves sums of order ``eps`` (bf16: 0.008), so the cut follows the dtype."""
    return max(ZERO_SHARE, 3 * float(torch.finfo(dtype).eps)) if dtype.is_floating_point else ZERO_SHARE


def kind_from_shares(shares: list[float], cut: float) -> bool | None:
    """``True`` (every finite share under ``cut``), ``False`` (every one above ``CLEAR_FACTOR *
    ZERO_SHARE`` and ``2 * cut``) or ``None`` (none finite, or mixed)."""
    vals = [s for s in shares if s == s]
    if not vals:
        return None
    if all(s < cut for s in vals):
        return True
    if all(s > max(CLEAR_FACTOR * ZERO_SHARE, 2 * cut) for s in vals):
        return False
    return None


def output_tensor(output: Any, loss: Any = None) -> torch.Tensor | None:
    """The model's prediction among its outputs: the tensor itself, the first of a tuple, or of a
    mapping (a ``transformers``/``diffusers`` output: ``logits`` first, never its ``loss``)."""
    if isinstance(output, Mapping):
        y = output.get("logits")
        if isinstance(y, torch.Tensor):
            return y
        return next((v for k, v in output.items() if isinstance(v, torch.Tensor) and v is not loss
                     and k != "loss"), None)
    y = first_tensor(output)
    return None if y is loss else y


@register_measurement
class LossKind(Measurement):
    """The output-gradient witness of a cross-entropy (see the module docstring); no signatures of
    its own: the monitor's ``loss_is_cross_entropy`` asks it when the loss's graph could not tell."""

    signatures = ()
    unchecked = ()  # its hook is out of the model on unchecked steps, and it waits for a checked close

    def __init__(self) -> None:
        self._ctx: AddonContext | None = None
        self._handle: Any = None
        self._pending: list[torch.Tensor] = []
        self._cut = ZERO_SHARE
        self._hooked = 0            # checked steps whose output got a gradient hook
        self._graph: bool | None = None  # what a loss returned by the forward says
        self._kind: bool | None = None
        self._read = False

    def enter(self, ctx: AddonContext) -> None:
        """Watch the model's output on the first checked steps."""
        self._ctx = ctx
        self._handle = ctx.root.register_forward_hook(self._on_output)
        ctx.checked_only(self._handle, self._on_output)

    def _on_output(self, module: Any, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return None  # a tensor hook per step would break the graph: unknown under torch.compile
        ctx = self._ctx
        if ctx is None or self._hooked >= WINDOW or not ctx.measuring():
            return None
        loss = getattr(output, "loss", None) if not isinstance(output, torch.Tensor) else None
        if isinstance(loss, torch.Tensor) and self._graph is None:
            self._graph = is_cross_entropy(loss)  # metadata only: the graph's node names
            if self._graph is not None:
                self._hooked = WINDOW
                self._drop()
                return None
        y = output_tensor(output, loss)
        if isinstance(y, torch.Tensor) and y.is_floating_point() and y.requires_grad and y.numel() > 0:
            self._hooked += 1
            self._cut = share_cut(y.dtype)
            y.register_hook(self._on_grad)
        return None

    def _on_grad(self, grad: torch.Tensor) -> None:
        try:
            with torch.no_grad():
                self._pending.append(row_sum_share(grad))
        except Exception as e:  # noqa: BLE001 - inside backward(): never raise
            if self._ctx is not None:
                self._ctx.report(("loss kind", type(e).__name__), f"loss-kind witness failed: {e!r}")
        return None

    def step_closed(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """Take the output hook out once its window is full (host side, outside any forward)."""
        if self._hooked >= WINDOW:
            self._drop()

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Remove the output hook."""
        self._drop()

    def _drop(self) -> None:
        if self._handle is not None:
            self._ctx.release(self._handle)
            self._handle = None

    def kind(self) -> bool | None:
        """``True``/``False``: the loss is / is not a cross-entropy; ``None``: not told. Reads the
        device values once (a query's transfer), after the window is full or the run ended."""
        if self._graph is not None:
            return self._graph
        if self._read:
            return self._kind
        if not self._pending or (self._hooked < WINDOW and self._handle is not None):
            return None
        shares = torch.stack(self._pending).tolist()
        self._kind, self._read = kind_from_shares(shares, self._cut), True
        self._pending = []
        return self._kind

    def summary(self) -> dict[Any, Any]:
        """No signatures of its own (the output size's gap says what the kind decided)."""
        return {}
