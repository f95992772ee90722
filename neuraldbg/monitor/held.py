"""Module outputs held to the end of the forward and measured together.

A small output (at most :data:`DEFER_NUMEL` elements) is not reduced in its module's hook: the
hook hands it to :class:`HeldOutputs`, and when the root's forward ends (or, for a loop that
calls sub-networks directly, when the backward starts or the step closes) the outputs held are
stacked by kind, shape and dtype and reduced together (:func:`neuraldbg.monitor.stats.batched_output_blocks`):
a hundred layers of one shape cost a few kernels instead of a few hundred, with the same values,
recorded as one :class:`~neuraldbg.monitor.records.Block` (no tensor per output).

An output that a later op writes into in place (``ReLU(inplace=True)`` after a ``Linear``)
would be read changed: each held output's version counter is compared when it is measured. A
module not yet known to be safe (``Spec.defer`` None) is measured in its hook *and* held as a
*probe*, only to learn that; a module whose output is written into is measured in its hook from
then on (``Spec.defer`` False), and a held output found written into is not read at all (a
missing observation for that step, never the changed values).

Lifecycle: :meth:`HeldOutputs.hold` from the output hooks, :meth:`HeldOutputs.flush` at the
end of a forward, at a backward's start and when a step closes, :meth:`HeldOutputs.clear` when
the hooks are removed. An output measured alone at a flush (no other of its kind, shape and
dtype held with it) is measured in its hook from the next check on: holding it saved nothing.
"""
from __future__ import annotations

import logging
from threading import get_ident
from typing import Any, Callable

import torch

from neuraldbg.monitor import stats as S
from neuraldbg.monitor.records import Block, Spec, StepBuffer

#: outputs of at most this many elements are held to the end of the forward and measured
#: together; a larger one is reduced in its hook, where its own kernels cost more than the
#: call, and holding it would hold its memory
DEFER_NUMEL = 16384
#: elements held before a batched measurement runs mid-forward (bounds the memory held)
FLUSH_NUMEL = 1 << 21


class HeldOutputs:
    """The outputs held for one monitor's batched measurement, and their flush.

    ``report(key, msg, level)`` logs once per key; ``fail(key, msg)`` reports a failure of the
    monitor's own statistics; ``disable(spec, exc)`` stops measuring a module whose statistics
    failed. Outputs are held only by, and flushed only on, the thread that made this object
    (the one that entered the monitor): replicas run in threads (DataParallel on several GPUs)
    are measured in their hooks, and the list is never appended to and swapped by two threads.
    """

    def __init__(self, report: Callable[..., None], fail: Callable[[tuple, str], None],
                 disable: Callable[[Spec, BaseException], None]) -> None:
        self._report, self._fail, self._disable = report, fail, disable
        # (spec, output, its version, elements, probe) of one buffer
        self.items: list[tuple] = []
        self._buf: StepBuffer | None = None
        self._n = 0
        self._owner = get_ident()

    def hold(self, spec: Spec, y: torch.Tensor, n: int, buf: StepBuffer) -> bool:
        """Hold ``y`` (``n`` elements, recorded into ``buf``) when it may wait for the flush.
        True: it is measured then, not in the hook. False: the hook measures it now (a module
        that is not deferred, a large or non-plain tensor, another thread; a probe is held and
        still measured now)."""
        defer = spec.defer
        if defer is False or n > DEFER_NUMEL or type(y) is not torch.Tensor or get_ident() != self._owner:
            return False
        if buf is not self._buf:
            self.flush()
            self._buf = buf
        self.items.append((spec, y, y._version, n, defer is None))
        self._n += n
        return bool(defer)

    def full(self) -> bool:
        """Whether the elements held exceed :data:`FLUSH_NUMEL` (then flush mid-forward)."""
        return self._n > FLUSH_NUMEL

    def clear(self) -> None:
        """Drop everything held (the hooks were removed)."""
        self.items, self._buf, self._n = [], None, 0

    def flush(self) -> None:
        """Measure the outputs held since the last flush, stacked by (kind, sum of squares,
        shape, dtype): one group costs a few kernels whatever its size. On a thread other than
        the owner (an autograd device thread during a GPU backward) this waits for the owner's
        next flush, at the latest when the step closes."""
        held, buf = self.items, self._buf
        if not held or get_ident() != self._owner:
            return
        self.items, self._n = [], 0
        try:
            self._measure(held, buf)
        except Exception as e:  # noqa: BLE001 - this runs inside forward and backward: never raise
            self._fail(("held outputs", type(e).__name__), f"output statistics failed at step {buf.step}: {e!r}")

    def _measure(self, held: list[tuple], buf: StepBuffer) -> None:
        # outputs on several devices fail to stack and are measured one at a time; records need
        # no forward order (the host's layout gathers each layer's statistics by slot)
        groups: dict[tuple, list[tuple]] = {}
        for item in held:
            spec, y, version, _, probe = item
            if y._version != version:
                spec.defer = False
                if not probe:
                    self._report((spec.name, "inplace"), f"the output of {spec.name} was changed in place "
                                 "after its module ran: it is measured in its hook from now on, and is "
                                 f"missing at step {buf.step}", level=logging.DEBUG)
            elif probe:
                spec.defer = True
            else:
                key = (spec.kind, spec.sq, y.shape, y.dtype)
                group = groups.get(key)
                if group is None:
                    groups[key] = [item]
                else:
                    group.append(item)
        records = buf.records
        # no grad-mode switch here: batched_output_blocks stacks under no_grad, output_stats reads y.detach()
        for (kind, sq, *_), items in groups.items():
            if len(items) == 1:
                # nothing measured with it: in its hook from the next check on, where the same
                # statistics cost less than holding them for the flush
                items[0][0].defer = False
            ys = [it[1] for it in items]
            if S.batchable(ys, kind):
                try:
                    scal, vec = S.batched_output_blocks(ys, kind, sq=sq)
                except Exception:  # noqa: BLE001 - one at a time below, each failure its own
                    pass
                else:
                    if kind == "relu":  # one shape: every output has the same unit count
                        units = vec.numel() // len(items)
                        slots = tuple(it[0].relu_slot(units) for it in items)
                    else:
                        slots = tuple(it[0].out for it in items)
                    records.append(Block(slots, tuple(it[3] for it in items), scal, vec))
                    buf.blocks = True
                    continue
            for spec, y, _, n, _ in items:
                o = self._measure_one(spec, y)
                if o is not None:
                    records.append((spec.relu_slot(o[0].numel()) if kind == "relu" else spec.out, n, o))

    def _measure_one(self, spec: Spec, y: torch.Tensor) -> Any:
        try:
            return S.output_stats(y, spec.kind, sq=spec.sq)
        except Exception as e:  # noqa: BLE001 - the monitor must not raise into training
            self._disable(spec, e)
            return None
