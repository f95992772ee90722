"""The live merge at exit: the ranks' traces gathered on rank 0 through the process group's
key-value store and merged there (:func:`neuraldbg.distributed.merge_traces`), ``docs/distributed.md``.

A trace crosses the store as its session document (``neuraldbg/session.py``) in JSON, without
the priors block, and rank 0 reads it back through the session schema: anything that can write
to the store can put anything under a rank's key, so a payload is data to validate, never code
to run. One that is not a valid trace of this job is logged and its rank named unobserved, like
a rank whose trace never came.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import time
from typing import Any

from neuraldbg.distributed import merge_traces
from neuraldbg.trace import Trace

log = logging.getLogger("neuraldbg")

#: seconds rank 0 waits at exit for the other ranks' traces (``NeuralDbg(merge_timeout=...)``)
DEFAULT_MERGE_TIMEOUT = 30.0
_POLL = 0.05
_PREFIX = "neuraldbg/live/"
#: monitors entered by this process under torch.distributed: the ranks of a job create their
#: monitors in the same order, so the n-th monitor of every rank meets under the same keys
_monitors = itertools.count()
#: seconds rank 0 gives, at exit, a rank that has not announced a monitor yet before naming it
#: monitor-less instead of waiting for its trace the whole ``merge_timeout``
ENTRY_GRACE = 2.0


def encode_trace(trace: Trace) -> bytes:
    """A rank's trace as it crosses the store: its session document in JSON, priors left out
    (they are the bulk of a session, and rank 0 diagnoses the merge with its own)."""
    from neuraldbg.session import trace_to_dict

    return json.dumps(trace_to_dict(trace, embed_priors=False)).encode()


class LiveMerge:
    """The ranks' traces gathered on rank 0 when their monitors exit, through the process group's
    key-value store (the gloo/NCCL rendezvous store), never through a collective.

    A collective at exit would hang every rank when one of them died, ran no monitor or exited
    the ``with`` block at another point (a query on rank 0 alone, an exception on one rank). The
    store needs no partner: each rank other than 0 puts its trace (:func:`encode_trace`) under
    this monitor's key and goes on; rank 0 polls for them for at most ``timeout`` seconds and
    merges what arrived (:func:`~neuraldbg.distributed.merge_traces`). A rank whose trace did not
    arrive, or arrived as something other than a valid trace of this job, is named in the merged
    trace's ``unobserved_ranks`` signature, from the last step of its autosave on (the path each
    rank announced on entry; that file, when readable, is merged in its place), or as wholly
    unobserved without one. Every failure is logged and swallowed: the training loop never sees
    one, and the wait is bounded.
    """

    def __init__(self, store: Any, rank: int, world_size: int, timeout: float) -> None:
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self.prefix = f"{_PREFIX}{next(_monitors)}/"

    @classmethod
    def start(cls, rank: int | None, world_size: int | None, timeout: float,
              autosave: str | None = None) -> "LiveMerge | None":
        """The live merge of a monitor entered under an initialized process group of several
        ranks (``None`` otherwise, or when ``timeout`` is 0); announces this rank's autosave path."""
        if rank is None or world_size is None or world_size < 2 or timeout <= 0:
            return None
        try:
            from torch.distributed import distributed_c10d

            store = distributed_c10d._get_default_store()  # the store every rank already reaches
        except Exception as exc:  # noqa: BLE001 - no store: per-rank exports still work
            log.warning("neuraldbg: no process-group store to merge the ranks' traces at exit (%r); merge "
                        "the per-rank exports with neuraldbg.merge_sessions", exc)
            return None
        merge = cls(store, rank, world_size, timeout)
        merge._set(f"entered/{rank}", b"1")  # rank 0 waits only for the ranks that run a monitor
        if autosave is not None:
            merge._set(f"autosave/{rank}", os.path.abspath(autosave).encode())
        return merge

    def _set(self, key: str, value: bytes) -> bool:
        try:
            self.store.set(self.prefix + key, value)
            return True
        except Exception as exc:  # noqa: BLE001 - a store gone with its host: log, go on
            log.warning("neuraldbg: could not publish %s to the process-group store: %r", key, exc)
            return False

    def _get(self, key: str) -> bytes | None:
        try:
            if self.store.check([self.prefix + key]):
                value = self.store.get(self.prefix + key)
                self.store.delete_key(self.prefix + key)
                return value
        except Exception as exc:  # noqa: BLE001
            log.warning("neuraldbg: could not read %s from the process-group store: %r", key, exc)
        return None

    def _has(self, key: str) -> bool:
        try:
            return bool(self.store.check([self.prefix + key]))
        except Exception:  # noqa: BLE001 - unreadable: treat as there, so the rank is waited for
            return True

    def finish(self, trace: Trace) -> Trace | None:
        """Publish ``trace`` (ranks other than 0; returns None) or gather the others' and return
        the job's merged trace (rank 0). Never raises."""
        try:
            if self.rank != 0:
                self._set(f"trace/{self.rank}", encode_trace(trace))
                return None
            return self._gather(trace)
        except Exception as exc:  # noqa: BLE001 - the loop must never see the monitor fail
            log.warning("neuraldbg: the live merge of the ranks' traces failed: %r; merge the per-rank exports "
                        "with neuraldbg.merge_sessions", exc)
            return None

    def _gather(self, own: Trace) -> Trace:
        traces = {0: own}
        waiting = set(range(1, self.world_size))
        no_monitor: set[int] = set()
        refused: dict[int, str] = {}
        start = time.monotonic()
        deadline = start + self.timeout
        # a rank that never entered a monitor (only rank 0 runs one, say) is not waited for the
        # whole timeout: after a short grace for ranks that start late, it is named and dropped
        grace = start + min(ENTRY_GRACE, self.timeout)
        while waiting:
            for r in sorted(waiting):
                raw = self._get(f"trace/{r}")
                if raw is not None:
                    got = self._decode(r, raw, own)
                    if isinstance(got, Trace):
                        traces[r] = got
                    else:
                        refused[r] = got
                    waiting.discard(r)
                elif time.monotonic() >= grace and not self._has(f"entered/{r}"):
                    no_monitor.add(r)
                    waiting.discard(r)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(_POLL)
        notes = {r: f"rank {r} from its start on (it entered no monitor)" for r in no_monitor}
        if no_monitor:
            log.info("neuraldbg: %s entered no monitor; the merged diagnosis names %s unobserved",
                     ", ".join(f"rank {r}" for r in sorted(no_monitor)), "it" if len(no_monitor) == 1 else "them")
        notes.update({r: self._missing(r, traces, f"its trace in the store was refused: {why}")
                      for r, why in refused.items()})
        notes.update({r: self._missing(r, traces) for r in waiting})
        if waiting:
            log.warning("neuraldbg: after %.0f s at exit, no trace from %s; the merged diagnosis names %s unobserved",
                        time.monotonic() - start, ", ".join(f"rank {r}" for r in sorted(waiting)),
                        "it" if len(waiting) == 1 else "them")
        ordered = [traces[r] for r in sorted(traces)]
        merged = merge_traces(ordered)
        if notes:
            from neuraldbg.causal.nodes.run import UNOBSERVED_RANKS

            merged = dataclasses.replace(merged, signatures=merged.signatures.updated(
                {UNOBSERVED_RANKS: "; ".join(notes[r] for r in sorted(notes))}))
        return merged

    def _decode(self, r: int, raw: bytes, own: Trace) -> Trace | str:
        """Rank ``r``'s trace read back from its payload through the session schema, or why it
        was refused (logged at WARNING)."""
        from neuraldbg.session import SessionFormatError, trace_from_dict

        source = f"rank {r}'s trace in the process-group store"
        detail = ""
        try:
            trace, _ = trace_from_dict(json.loads(raw.decode("utf-8")), source=source)
        except UnicodeDecodeError:
            # a NeuralDBG from before the JSON form sent a pickle: name it, as loading one runs code
            why = "not UTF-8 JSON" + (" (a pickle, which is never loaded)" if raw[:1] == b"\x80" else "")
        except SessionFormatError as exc:
            why = "not a valid session document" + (f" (at {exc.field})" if exc.field else "")
            detail = str(exc).removeprefix(source).lstrip(": ")  # the log line names the source once
        except Exception as exc:  # noqa: BLE001 - JSON syntax, nesting, integer digits: never the loop's
            why = "not JSON" if isinstance(exc, json.JSONDecodeError) else f"unreadable ({type(exc).__name__})"
            detail = str(exc)
        else:
            why = self._foreign(trace, r, own)
            if why is None:
                return trace
        log.warning("neuraldbg: refused %s: %s%s; the merged diagnosis names rank %d unobserved",
                    source, why, f" ({detail})" if detail else "", r)
        return why

    def _foreign(self, trace: Trace, r: int, own: Trace) -> str | None:
        """Why a valid session is not rank ``r``'s trace of this job (None when it is): one that
        would not merge with the others must not cost them the merge."""
        if trace.rank != r:
            return f"it is the trace of rank {trace.rank}"
        if trace.family != own.family:
            return f"it is of family {trace.family!r}, not {own.family!r}"
        if trace.world_size != self.world_size:
            return f"it is from a job of {trace.world_size} ranks, not {self.world_size}"
        return None

    def _missing(self, r: int, traces: dict[int, Trace], why: str | None = None) -> str:
        """What is known of rank ``r``, whose trace did not arrive (or was refused, ``why``): its
        last autosave is merged in its place when it announced one and the file reads back."""
        why = why or f"no trace at exit within {self.timeout:g} s (killed, hung or without a monitor)"
        raw = self._get(f"autosave/{r}")
        if raw is None:
            return f"rank {r} from its start on ({why}; no autosave)"
        path = raw.decode(errors="replace")
        try:
            from neuraldbg.session import load_session

            saved = load_session(path).trace()
        except Exception as exc:  # noqa: BLE001 - a missing or torn file: the rank is unobserved
            return f"rank {r} from its start on ({why}; its autosave {path} did not read: {type(exc).__name__})"
        saved = dataclasses.replace(saved, rank=r)
        foreign = self._foreign(saved, r, traces[0])  # the path came through the store too
        if foreign is not None:
            return f"rank {r} from its start on ({why}; its autosave {path} was refused: {foreign})"
        traces[r] = saved
        return f"rank {r} from step {saved.last_step} on ({why}; its last autosave, {path}, is merged)"
