"""Device -> host transfer: closed steps queued as recorded, moved in one batch, read with numpy.

A closed checked step keeps the 0-d statistics its hooks recorded and one 1-d vector of
gradient norms per backward pass; an unchecked step keeps only its losses and costs no
device work at all. Every ``sync_every`` checked steps the whole queue is stacked into one
flat tensor and moved to the host in one copy (the only device sync of the monitor), where
:mod:`neuraldbg.monitor.layout` reads the steps back into per-layer numpy columns with a layout
compiled once per distinct step structure (cached: a training loop repeats one structure), the
consecutive steps of one structure together (:func:`~neuraldbg.monitor.layout.read_run`).
Queuing a step calls no numpy: its element counts wait as Python ints for the transfer.
"""
from __future__ import annotations

from itertools import chain
from time import perf_counter
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from neuraldbg.events.stepstats import StepStats
from neuraldbg.monitor.layout import MAX_LAYOUTS, Layout, read_loss, read_run, run_key, to_stepstats
from neuraldbg.monitor.records import OUT, Block

if TYPE_CHECKING:  # pragma: no cover
    from neuraldbg.monitor.records import StepBuffer, Tables

#: unchecked steps queued before a transfer even without a checked step (bounds memory)
MAX_PENDING = 1024


_NO_COUNTS = (0,)  # a step without records: only the "absent" count


class _Pending:
    """One closed step in the queue, its statistics packed into a few tensors (:meth:`pack`)."""

    __slots__ = ("step", "checked", "slots", "ns", "pgrad", "tensors", "floats", "scale", "has_bwd", "tables",
                 "ran_without_grad", "lay", "scalars", "n_scalars", "vectors", "n_vectors", "blocks")

    def __init__(self, buf: "StepBuffer") -> None:
        self.step = buf.step
        self.checked = buf.active
        records = buf.records
        self.blocks = buf.blocks
        # element counts stay Python ints until the transfer reads them (layout.py): numpy's code,
        # cold after the optimizer step, cost more here than the counts themselves; the trailing
        # 0 is the "absent" count (see Layout)
        if records and buf.blocks:  # a Block stands for several records
            slots, ns = [], []
            for r in records:
                if type(r) is Block:
                    slots.extend(r.slots)
                    ns.extend(r.ns)
                else:
                    slots.append(r[0])
                    ns.append(r[1])
            self.slots = tuple(slots)
            self.ns = (*ns, 0)
        elif records:
            self.slots, ns, _ = zip(*records)  # one pass over the records, in C
            self.ns = (*ns, 0)
        else:  # an unchecked step: this runs once per training step, so it is kept lean
            self.slots, self.ns = (), _NO_COUNTS
        self.pgrad = buf.pgrad
        self.floats, self.tensors = _split_losses(buf.losses)
        self.scale = buf.scale
        self.has_bwd = bool(buf.pgrad)
        self.tables = buf.tables
        self.ran_without_grad = buf.ran_without_grad
        self.lay: Layout | None = None
        self.scalars: list[torch.Tensor] = []
        self.vectors: list[torch.Tensor] = []
        self.n_scalars = self.n_vectors = 0

    def pack(self, lay: "Layout | None", records: list[tuple]) -> None:
        """This step's values in flat order (see :class:`Layout`): the scalars (record values,
        losses, scale), then the per-unit ReLU maxima and the gradient norms. A checked step's
        record values are stacked now, one kernel each for the scalars and the maxima: the
        queue then holds a few tensors per step, not one Python object per statistic, which
        would survive into the garbage collector's oldest generation and make its full
        collections (a pause proportional to every object of the process) frequent."""
        self.lay = lay
        scalars: list[torch.Tensor] = []
        vectors: list[torch.Tensor] = []
        blocks = bool(records) and self.blocks
        if blocks:  # 0-d values and 1-d runs of them (Block records)
            scalars, vectors = _block_parts(records, self.tables)
        elif records:
            vals = list(chain.from_iterable(r[2] for r in records))
            if lay.pick_scalars is not None:  # ReLU maxima (1-d) go with the vectors
                vectors = lay.pick_vectors(vals)
                vals = lay.pick_scalars(vals)
            scalars = vals
        for t in self.tensors:
            scalars.append(t if t.dim() == 0 else t.reshape(()))
        if self.scale is not None:
            scalars.append(self.scale.reshape(()))
        # the scalar values: the layout's count where runs stand for several
        self.n_scalars = lay.size if blocks else len(scalars)
        self.n_vectors = (lay.relu_len if lay is not None else 0) + (
            sum(v.numel() for _, v in self.pgrad) if self.pgrad else 0)
        if records:
            scalars = _stacked(_runs(scalars), torch.cat) if blocks else _stacked(scalars, torch.stack)
            vectors = _stacked(vectors, torch.cat)
        self.scalars = scalars
        self.vectors = vectors + [v for _, v in self.pgrad]


def _block_parts(records: list, tables: "Tables") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The record values of a step with :class:`Block` records, in flat order (see
    :class:`Layout`): ``(scalars, maxima)``, the scalars 0-d tensors or 1-d runs of them."""
    scal: list[torch.Tensor] = []
    vec: list[torch.Tensor] = []
    slots = tables.slots
    for r in records:
        if type(r) is Block:
            if r.scal is not None:
                scal.append(r.scal)
            if r.vec is not None:
                vec.append(r.vec)
            continue
        group, _, kind, _, units = slots[r[0]]
        vals = r[2]
        if group == OUT and kind == "relu" and units > 0:  # per-unit maxima first (S.output_stats)
            vec.append(vals[0])
            scal.extend(vals[1:])
        else:
            scal.extend(vals)
    return scal, vec


def _runs(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``parts`` (0-d tensors and 1-d runs) as 1-d tensors in the same order, each run of 0-d
    tensors stacked into one."""
    out: list[torch.Tensor] = []
    run: list[torch.Tensor] = []
    for t in parts:
        if t.dim() == 0:
            run.append(t)
            continue
        if run:
            out.append(torch.stack(run))
            run = []
        out.append(t)
    if run:
        out.append(torch.stack(run))
    return out


def _split_losses(losses: list) -> tuple[list, list]:
    """``(floats, tensors)`` of a step's losses (one loss, the common case, without a scan)."""
    if len(losses) == 1:
        one = losses[0]
        return ([], [one]) if isinstance(one, torch.Tensor) else ([one], [])
    return ([x for x in losses if not isinstance(x, torch.Tensor)],
            [x for x in losses if isinstance(x, torch.Tensor)])


def _stacked(tensors: list[torch.Tensor], join: Callable) -> list[torch.Tensor]:
    """``[join(tensors)]``, or the tensors as they are where they cannot be joined (several
    devices: each then travels on its own)."""
    if len(tensors) < 2:
        return tensors
    try:
        return [join(tensors)]
    except RuntimeError:
        return tensors


class HostTransfer:
    """The queue of closed steps and its batched move to the host.

    ``consume`` receives each step's :class:`StepStats`, in the order the steps were pushed.
    """

    def __init__(self, sync_every: int, consume: Callable[[StepStats], None]) -> None:
        self.sync_every = sync_every
        self.pending: list[_Pending | tuple] = []  # a closed step, or an unchecked step's (step, loss)
        self._checked = 0
        self._consume = consume
        self._layouts: dict[tuple, Layout] = {}
        self._batches: dict[tuple, tuple] = {}  # parameter batches seen (layout._read_pgrad)
        #: host seconds spent in :meth:`drain` so far: the "auto" cadence counts them apart from
        #: the steps they fall in (neuraldbg/monitor/cadence.py)
        self.seconds = 0.0

    def push(self, buf: "StepBuffer") -> None:
        """Queue a closed step (no device work); transfer the queue once it holds
        ``sync_every`` checked steps."""
        p = _Pending(buf)
        p.pack(self._layout(p), buf.records)
        self.pending.append(p)
        self._checked += buf.active
        if self._checked >= self.sync_every or len(self.pending) >= MAX_PENDING:
            self.drain()

    def push_loss(self, step: int, loss: "float | torch.Tensor") -> None:
        """Queue the loss of an unchecked step that recorded nothing else: a ``(step, loss)``
        pair, no packing (this runs on every unchecked step)."""
        self.pending.append((step, loss))
        if len(self.pending) >= MAX_PENDING:
            self.drain()

    def drain(self) -> None:
        """Move every queued step to the host in one copy and consume them in order."""
        pending, self.pending, self._checked = self.pending, [], 0
        if not pending:
            return
        t0 = perf_counter()
        try:
            self._drain(pending)
        finally:
            self.seconds += perf_counter() - t0

    def _drain(self, pending: list) -> None:
        scalars: list[torch.Tensor] = []
        vectors: list[torch.Tensor] = []
        starts, vstarts, z_at, v_at = [], [], 0, 0
        for p in pending:
            starts.append(z_at)
            vstarts.append(v_at)
            if type(p) is tuple:  # an unchecked step's loss (push_loss)
                if type(p[1]) is not float:
                    scalars.append(p[1])
                    z_at += 1
                continue
            scalars.extend(p.scalars)
            vectors.extend(p.vectors)
            z_at += p.n_scalars
            v_at += p.n_vectors
        host = _to_host(scalars, vectors)
        i, n = 0, len(pending)
        while i < n:
            p, z0 = pending[i], starts[i]
            if type(p) is tuple:  # read in float32, as every loss is (_loss)
                step, loss = p
                self._consume(StepStats(step, loss if type(loss) is float else float(np.float32(host[z0]))))
                i += 1
                continue
            lay = p.lay
            key = run_key(p)
            j = i + 1
            if key is not None:  # the steps after it that share its layout are read with it
                while j < n and type(q := pending[j]) is not tuple and run_key(q) == key:
                    j += 1
                run = pending[i:j]
                losses = [read_loss(q, host, starts[i + r], lay) for r, q in enumerate(run)]
                for st in read_run(run, host, z0, z_at + vstarts[i], self._batches, losses):
                    self._consume(st)
            else:
                where = (p, lay, z0, z_at + vstarts[i], self._batches)
                self._consume(to_stepstats(p.step, where, host, read_loss(p, host, z0, lay), p.has_bwd))
            i = j

    def _layout(self, p: _Pending) -> "Layout | None":
        if not (p.slots or p.pgrad or p.scale is not None):
            return None  # only losses: read directly
        key = (p.tables.version, p.slots, len(p.tensors), p.scale is not None)
        lay = self._layouts.get(key)
        if lay is None:
            if len(self._layouts) >= MAX_LAYOUTS:
                self._layouts.clear()
            lay = self._layouts[key] = Layout(p.tables, key[1], key[2], key[3])
        return lay


def _to_host(scalars: list[torch.Tensor], vectors: list[torch.Tensor]) -> np.ndarray:
    """One flat float64 host array: the scalars (0-d, or 1-d runs of them already stacked),
    then the vectors (one device copy)."""
    if not scalars and not vectors:
        return np.zeros(0)
    try:
        parts = [t.reshape(-1) if t.dim() != 1 else t for t in scalars] + vectors
        flat = torch.cat(parts) if len(parts) > 1 else parts[0]
        return flat.detach().cpu().double().numpy()
    except RuntimeError:  # statistics on several devices (model parallel): one copy each
        vals = [t.detach().reshape(-1).cpu().double().numpy() for t in scalars + vectors]
        return np.concatenate(vals) if vals else np.zeros(0)
