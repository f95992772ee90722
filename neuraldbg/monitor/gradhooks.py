"""The parameter-gradient half of the monitor's hooks (:class:`GradientHooks`).

Each hooked parameter's post-accumulate-grad hook notes its gradient on a checked step; the
first one of a backward pass queues a callback that runs when the pass ends (after
accumulation, before clipping or the optimizer) and measures every gradient of the pass at
once: one ``torch._foreach_norm``, same-shaped small gradients stacked. A parameter given such a
hook costs every backward pass a call into Python inside torch, checked step or not, even once
the hook is switched out or removed (``docs/overhead.md``): above
``DetectorConfig.group_param_hooks_above`` trainable parameters a module's parameters share one
hook, and the others' gradients are read when the pass ends, the same values.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from neuraldbg.monitor import stats as S
from neuraldbg.monitor.records import StepBuffer


class GradientHooks:
    """The parameter hooks of :class:`neuraldbg.monitor.hooks.ModuleHooks`, which holds their
    state (the step buffer, the switch, the tables, ``group_params``) and inherits these."""

    def _hook_params(self, owner: dict[int, tuple[str, int, nn.Parameter]]) -> None:
        """Hook the parameters in ``owner`` (id -> (layer name, layer index, parameter)): one
        hook each, or one per module where they share it."""
        by_module: dict[str, list[tuple[int, nn.Parameter]]] = {}
        for name, layer, p in owner.values():
            # a sharded parameter (FSDP2) counts the elements of this rank's shard: its gradient
            # is read there (see _on_param_grad), so the layer's RMS is the shard's
            by_module.setdefault(name, []).append((self.tables.param(layer, S.local_numel(p)), p))
        for name, params in by_module.items():
            if self.group_params and len(params) > 1 and not any(S.is_sharded(p) for _, p in params):
                # one hook for a module's parameters (a weight and its bias): a hooked parameter
                # costs every backward pass a call into Python inside torch, checked step or not
                # (docs/overhead.md). The others' gradients are read when the pass ends
                # (_grads_done), after every accumulation of the pass: the same values.
                fn = partial(self._on_module_grads, tuple(params), name)
                hooks = [(params[0][1], fn)]
                self._mates[id(params[0][1])] = tuple(p for _, p in params)
            else:  # a shard's gradient is read when its hook fires: its reduce-scatter is done then
                hooks = [(p, partial(self._on_param_grad, pidx, name, sharded=S.is_sharded(p))) for pidx, p in params]
            for p, fn in hooks:
                h = p.register_post_accumulate_grad_hook(fn)
                self.handles.append(h)
                self.switch.add(h, fn)
                self.hooked[name][1].append(h)
            self.hooked[name][2].extend(id(p) for _, p in params)
            self.hooked_params.update(id(p) for _, p in params)

    def accumulated_with(self, param: Any) -> tuple[Any, ...]:
        """The parameters whose gradients a backward pass may have accumulated by the time the
        hook of ``param`` fires: its module's, where they share its hook, else ``param`` alone."""
        return self._mates.get(id(param), (param,))

    def _open_pass(self, buf: StepBuffer, param: Any) -> tuple | None:
        """The running backward pass's pending gradients ``(buffer, [param index], [grad],
        [a module's (param index, param) pairs])``, opened at its first hooked gradient; None
        where no autograd engine runs (no final callback to wait for: the caller measures now)."""
        if buf.eval_skipped and not buf.n_fwd and not self.eval_trains:
            # a backward after eval()-mode forwards: this model trains in eval mode
            self.eval_trains = True
            self._report(("eval_trains",), "the model is trained in eval() mode; its forward "
                         "passes are now measured in eval mode too", level=logging.INFO)
        pend = self._pending
        if pend is None or pend[0] is not buf:
            self.flush()  # a loop that never ran the root's forward: its outputs, before backward
            self._capture_scale(buf)
            pend = self._pending = (buf, [], [], [])
            if self.backward_started is not None:
                self.backward_started(param)
            if not _queue_at_backward_end(self._grads_done):
                self._pending = None
                return None
        return pend

    def _on_module_grads(self, params, name, param):
        """The hook a module's parameters share (``params``: its ``(param index, param)``
        pairs): noted now, their gradients read when the backward pass ends."""
        buf = self.buf
        if not buf.active or param.grad is None:
            return None
        try:
            pend = self._open_pass(buf, param)
            if pend is None:  # not inside the autograd engine: measure what they hold now
                got = [(i, p.grad) for i, p in params if p.grad is not None]
                with torch.no_grad():
                    buf.pgrad.append((tuple(i for i, _ in got), S.grad_norms([g for _, g in got])))
                return None
            pend[3].append(params)
        except Exception as e:  # noqa: BLE001
            self._fail((name, "pgrad", type(e).__name__), f"parameter-gradient statistics failed: {e!r}")
        return None

    def _on_param_grad(self, pidx, name, param, sharded=False):
        buf = self.buf
        if not buf.active:
            return None
        try:
            if param.grad is None:
                return None
            pend = self._open_pass(buf, param)
            if pend is None:  # not inside the autograd engine (no final callbacks): measure this one now
                with torch.no_grad():
                    buf.pgrad.append(((pidx,), S.grad_norms([S.local(param.grad)])))
                return None
            # its final value for this backward pass. FSDP2 calls this hook on the sharded
            # parameter once its gradient is reduce-scattered (the mean over the ranks, a DTensor):
            # the norm is this rank's shard's. Its RMS stands for the whole gradient's (the
            # detectors read RMS and finiteness, not the norm of the whole tensor), so no
            # collective is issued per hook or per sync; a non-finite entry in one shard shows on
            # the rank that holds it, and the ranks' events are merged at exit (distributed.py)
            # two flat lists, not a tuple per parameter: fewer objects for the garbage collector
            pend[1].append(pidx)
            pend[2].append(S.local(param.grad) if sharded else param.grad)
        except Exception as e:  # noqa: BLE001
            self._fail((name, "pgrad", type(e).__name__), f"parameter-gradient statistics failed: {e!r}")
        return None

    def _grads_done(self) -> None:
        """End of a backward pass: every gradient it accumulated, in a few batched norms."""
        pend, self._pending = self._pending, None
        if pend is None:
            return
        buf, ids, grads, modules = pend
        try:
            for params in modules:  # every accumulation of this pass is done now
                for i, p in params:
                    g = p.grad
                    if g is not None:
                        ids.append(i)
                        grads.append(g)
            if not ids:
                return
            ids = tuple(ids)
            plan = self._plans.get(ids)
            if plan is None:
                if len(self._plans) >= 16:  # the set of gradients changes (e.g. frozen layers)
                    self._plans.clear()
                groups = S.norm_plan(list(grads))
                # the norms come out group by group: the parameter indices in that order
                order = tuple(ids[i] for pos in (*groups[0], groups[1]) for i in pos)
                plan = self._plans[ids] = (groups, order)
            groups, order = plan
            with torch.no_grad():
                try:
                    norms = S.planned_norms(grads, groups)
                except RuntimeError:  # a gradient changed shape or layout: measure them as they are
                    norms, order = S.grad_norms(list(grads)), ids
            buf.pgrad.append((order, norms))
        except Exception as e:  # noqa: BLE001 - this runs inside backward(): never raise
            self._fail(("pgrad", type(e).__name__), f"parameter-gradient statistics failed: {e!r}")

    def _capture_scale(self, buf: StepBuffer) -> None:
        """The scaler's scale in force during this step's backward, as a device tensor (no
        host sync); the host divides the gradient norms by it.

        Taken once per step, at its first gradient: ``GradScaler.update()`` changes the scale
        in place after the step, so a copy keeps the scale these gradients were multiplied by.
        """
        if self.scaler is None or buf.scale is not None or not self.scaler.is_enabled():
            return
        t = getattr(self.scaler, "_scale", None)  # private, but the only sync-free view of the scale
        if isinstance(t, torch.Tensor):
            buf.scale = t.detach().reshape(1).float().clone()
        else:  # pragma: no cover - a scaler-like object without a tensor scale
            buf.scale = torch.tensor([float(self.scaler.get_scale())])


# ---- helpers --------------------------------------------------------------------------

def _queue_at_backward_end(fn: Callable[[], None]) -> bool:
    """Run ``fn`` when the running backward pass ends (False when there is none)."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(fn)
        return True
    except RuntimeError:
        return False
