"""What a monitor answers once it has watched: its events, trace, layers, signatures and exports.

:class:`MonitorResults` is the reading half of :class:`~neuraldbg.monitor.monitor.NeuralDbg`
(which inherits it), over the state the monitor keeps: the event log and loss history of
:class:`~neuraldbg.monitor.feed.EventFeed`, the hooks' forward order, the parts' summaries.
Reading anything flushes first (one host transfer), except ``trace(flush=False)``. The causal
queries it inherits (:class:`~neuraldbg.queries.CausalQueries`) answer from :meth:`trace`.
"""
from __future__ import annotations

from typing import Any

from neuraldbg.causal.nodes.run import EVERY, GRAD_STEPS, LR, OPTIMIZER, STATS_STEPS
from neuraldbg.distributed import concat_traces
from neuraldbg.events.base import Event
from neuraldbg.events.compress import Propagation, compress
from neuraldbg.monitor.measurements.reference import ReferenceLoss
from neuraldbg.monitor.stats import measurable
from neuraldbg.queries import CausalQueries
from neuraldbg.trace import LayerInfo, Signatures, Trace


class MonitorResults(CausalQueries):
    """Mixin: the results of ``docs/api.md`` (events, trace, layers, signatures, export) read
    from a monitor's state."""

    # ---- signatures (docs/causal_model.md) ----------------------------------------------
    def signatures(self) -> Signatures:
        """Every signature measured so far (one host transfer): the monitor's own (``every``: the
        interval the run's first steps were checked at,
        the optimizer and its learning rates) and each measurement's, checked against its
        declaration; a measurement that reports an undeclared or invalid one is reported as
        an internal error and its values are left out."""
        # the interval the first steps were checked at (every="auto" checks them all): what the
        # diagnosis reads the initialization's window with
        values: dict[str, Any] = {EVERY.name: self._cadence.entry_interval,
                                  OPTIMIZER.name: type(self.optimizer).__name__ if self.optimizer else None,
                                  STATS_STEPS.name: self._consumed, GRAD_STEPS.name: self._grad_steps}
        if self.optimizer is not None:
            try:
                values[LR.name] = tuple(float(g.get("lr", float("nan"))) for g in self.optimizer.param_groups)
            except Exception:  # noqa: BLE001 - a custom optimizer without param_groups
                pass
        steps, gaps = self._parts.summaries(values)
        return Signatures(values, steps, gaps)

    # ---- results -----------------------------------------------------------------------
    @property
    def internal_errors(self) -> int:
        """Failures inside the monitor so far (each logged once, none raised into training)."""
        return self._internal_errors

    @property
    def events(self) -> list[Event]:
        """The collapsed events, in step order."""
        self._flush()
        return self._log.events

    @property
    def synced_step(self) -> int | None:
        """The last step whose statistics have reached the host (``None`` before the first
        transfer). Reading it forces nothing: a framework callback polls it to act once per
        statistics sync, then reads ``trace(flush=False)`` (``docs/api.md``)."""
        return None if self._first_step is None else self._last_step

    def events_frame(self):
        """The events as a ``pandas.DataFrame`` (one row per collapsed event)."""
        from neuraldbg.session import events_frame

        return events_frame(self.events)

    def propagation(self) -> list[Propagation]:
        """First occurrence and layer-by-layer propagation of each event kind."""
        tr = self.trace()
        return compress(tr.events, tr.layer_index)

    def layers(self) -> tuple[LayerInfo, ...]:
        """Monitored modules in forward order (modules never called come last)."""
        modules = self._hooks.modules
        names = list(self._hooks.order) + [n for n, _ in modules if n not in self._order_pos]
        mods = dict(modules)
        role = self._roles.role if self._roles is not None else (lambda n: "")
        return tuple(LayerInfo(name=n, type=type(mods[n]).__name__, index=i,
                               n_params=sum(p.numel() for p in mods[n].parameters(recurse=False) if measurable(p)),
                               role=role(n))
                     for i, n in enumerate(names))

    def trace(self, flush: bool = True) -> Trace:
        """Events plus context, the causal engine's input. ``flush=False`` reads only what has
        reached the host (up to :attr:`synced_step`), without closing the current step or
        forcing a transfer: safe to call from inside a training step."""
        events = tuple(self.events if flush else self._log.events)
        try:
            sigs = self.signatures()
        except Exception as e:  # noqa: BLE001 - the diagnosis then runs without signatures
            self._internal_errors += 1
            self._report(("internal", "signatures", type(e).__name__), f"internal error in signatures: {e!r}")
            sigs = Signatures()
        first, last = self._first_step or 0, self._last_step
        earlier = self.settings.resume
        if earlier is not None and self._first_step is None:
            # nothing of this part has reached the host yet: it is where the earlier part ended
            first = last = earlier.last_step
        own = Trace(events=events, layers=self.layers(), family=self.family, first_step=first, last_step=last,
                    loss=self._loss.summary(), rank=self.rank, world_size=self.world_size, signatures=sigs,
                    internal_errors=self._internal_errors, cadence=self._cadence.record())
        if earlier is None:
            return own
        try:
            return concat_traces(earlier, own)
        except Exception as e:  # noqa: BLE001 - a state that does not fit: this part alone, logged once
            self._fail("resume", e)
            return own

    def session_dict(self) -> dict:
        """The session document of :meth:`trace` (``trace_to_dict``: JSON-safe, no tensors) without
        the embedded priors: what the framework callbacks keep in a checkpoint and pass back as
        ``resume=`` (the resumed monitor diagnoses with its own priors)."""
        from neuraldbg.session import trace_to_dict

        doc = trace_to_dict(self.trace(), config=self.config.to_dict(), priors=self.priors)
        doc["priors"] = None
        return doc

    @property
    def merged_trace(self) -> Trace | None:
        """The whole job's trace, on rank 0 of a distributed job once the monitor has exited (the
        ranks' traces merged live, ``docs/distributed.md``); ``None`` elsewhere. The queries
        (posterior, hypotheses, coverage) answer from it when it is there; :meth:`trace` and
        the export stay this rank's."""
        return self._merged

    def _diagnosed(self) -> Trace:
        return self._merged if self._merged is not None else self.trace()

    def reference_points(self) -> list[tuple[int, float]]:
        """``(step, reference loss)`` recorded so far (``reference=``; empty without one)."""
        ref = self.addon(ReferenceLoss)
        return ref.points() if ref is not None else []

    def export_aquarium_package(self, path) -> str:
        """Write the session as one versioned JSON document (atomically); returns the path."""
        from neuraldbg.session import export_trace

        return export_trace(self.trace(), path, config=self.config.to_dict(), priors=self.priors)

    def verify(self, replay, steps: int = 20, top: int = 3):
        """Replay each top hypothesis' window with its fix; a ``Verification`` (docs/verification.md)."""
        from neuraldbg.verify.api import verify
        return verify(self, replay, steps=steps, top=top)
