"""Device -> host transfer: each closed step packed into one tensor, queued, moved in batches.

A closed step's statistics are concatenated into one flat float32 tensor; its *layout*
(group, layer, field names, element count per slice) says how to read it back. Packed steps
wait in a queue that moves to the host every ``sync_every`` steps, where
:func:`_to_stepstats` turns the numbers back into the named floats detectors read. Nothing
here synchronizes with the device except :meth:`HostTransfer.drain`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from neuraldbg.events.stepstats import StepStats
from neuraldbg.monitor import stats as S

if TYPE_CHECKING:  # pragma: no cover
    from neuraldbg.monitor.hooks import _StepBuffer

#: the layout name of the model-input slices (not a module name, so it cannot collide)
INPUT_KEY = "<input>"


def pack(buf: "_StepBuffer") -> tuple:
    """A closed step as ``(step, layout, flat, loss_t, floats, has_backward)``, without a sync.

    ``flat`` is the concatenated statistics (None when only losses were recorded), ``loss_t``
    the mean of the step's tensor losses as a 1-element device tensor (or None) and
    ``floats`` its float losses.
    """
    tensors: list[torch.Tensor] = []
    layout: list[tuple] = []
    for name, fields, n, t in buf.fwd:
        layout.append(("out", name, fields, n))
        tensors.append(t)
    for name, n, t in buf.gout:
        layout.append(("gout", name, S.GRAD_FIELDS, n))
        tensors.append(t)
    for name, n, t in buf.pgrad.values():
        layout.append(("pgrad", name, S.GRAD_FIELDS, n))
        tensors.append(t)
    for n, t in buf.inputs:
        layout.append(("input", INPUT_KEY, S.INPUT_FIELDS, n))
        tensors.append(t)
    if buf.scale is not None:
        layout.append(("scale", None, ("scale",), 1))
        tensors.append(buf.scale)
    floats = [x for x in buf.losses if not isinstance(x, torch.Tensor)]
    dev_losses = [x for x in buf.losses if isinstance(x, torch.Tensor)]
    loss_t = torch.stack([x.float() for x in dev_losses]).mean().reshape(1) if dev_losses else None
    return (buf.step, layout, _concat(tensors), loss_t, floats, bool(buf.pgrad or buf.gout))


class HostTransfer:
    """The queue of packed steps and its batched move to the host.

    ``consume`` receives each step's :class:`StepStats`, in the order the steps were pushed.
    """

    def __init__(self, sync_every: int, consume: Callable[[StepStats], None]) -> None:
        self.sync_every = sync_every
        self.pending: list[tuple] = []
        self._consume = consume

    def push(self, buf: "_StepBuffer") -> None:
        """Queue a closed step; transfer the queue once it holds ``sync_every`` steps."""
        self.pending.append(pack(buf))
        if len(self.pending) >= self.sync_every:
            self.drain()

    def drain(self) -> None:
        """Move every queued step to the host (one copy per step) and consume it."""
        pending, self.pending = self.pending, []
        for step, layout, flat, loss_t, floats, has_bwd in pending:
            host = flat.detach().cpu().tolist() if flat is not None else []
            loss_vals = floats + ([float(loss_t.cpu())] if loss_t is not None else [])
            loss = sum(loss_vals) / len(loss_vals) if loss_vals else None
            st = _to_stepstats(step, layout, host, loss, has_bwd)
            self._consume(st)


def _concat(tensors: list[torch.Tensor]):
    """One flat float32 tensor (on the first tensor's device) from many small ones."""
    if not tensors:
        return None
    dev = tensors[0].device
    parts = [t.reshape(-1).float() if t.device == dev else t.reshape(-1).float().to(dev) for t in tensors]
    return torch.cat(parts)


def _to_stepstats(step, layout, host, loss, has_bwd) -> StepStats:
    """Named floats of one step from its layout and the transferred values."""
    st = StepStats(step=step, loss=loss, has_backward=has_bwd)
    i = 0
    fracs: dict[tuple[str, str], list[float]] = {}
    for group, name, fields, n in layout:
        vals = host[i:i + len(fields)]
        i += len(fields)
        if group == "scale":
            st.grad_scale = vals[0]
            continue
        if group == "input":
            d = st.inputs if st.inputs is not None else {"sum": 0.0, "sumsq": 0.0, "nan": 0.0, "inf": 0.0, "n": 0.0}
            for f, v in zip(fields, vals):
                d[f] += v
            d["n"] += n
            st.inputs = d
            continue
        d = st.layers.setdefault(name, {})
        prefix = {"out": "out_", "gout": "gout_", "pgrad": "pgrad_"}[group]
        for f, v in zip(fields, vals):
            if f.endswith("_frac"):
                fracs.setdefault((name, f), []).append(v)  # a shared module: average its calls
            else:
                d[prefix + f] = d.get(prefix + f, 0.0) + v
        d[prefix + "n"] = d.get(prefix + "n", 0) + n
    for (name, f), vs in fracs.items():
        st.layers[name][f] = sum(vs) / len(vs)
    return st
