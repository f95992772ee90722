"""The parameter-gradient half of the monitor's hooks (:class:`GradientHooks`).

Every parameter gradient of one backward pass is measured when the pass ends (after
accumulation, before clipping or the optimizer), by a callback queued to the autograd engine:
one ``torch._foreach_norm``, small gradients of one shape stacked where there are at least
``stats.GROUP_MIN`` of them (a deep stack's hundreds). What notices the pass:

- **the model output's gradient** (the default): on a checked step the root's forward hook puts
  a hook on the autograd node that made the output (a tensor hook on a leaf output, or under
  torch.compile), which fires before any parameter accumulates and asks the engine which
  parameters' accumulation nodes this pass will run. The hook dies with its graph, so nothing
  stays in torch: an unchecked step, and the model after the monitor exits, pay nothing;
- **parameter hooks**, where the output cannot see every pass: sharded parameters (FSDP2: a
  shard's gradient is final when its reduce-scatter is), DDP and DataParallel, parameters that
  carry post-accumulate-grad hooks of their own (an optimizer run in backward), a loop that calls
  sub-networks outside the root's forward, a loss not computed from the output
  (:meth:`GradientHooks.check_output_grads`), or ``DetectorConfig.param_grad_hooks``. A
  parameter given such a hook costs every backward pass a call into Python inside torch,
  checked step or not, even once the hook is switched out or removed (``docs/overhead.md``):
  above ``DetectorConfig.group_param_hooks_above`` trainable parameters a module's parameters
  share one hook, and the others' gradients are read when the pass ends, the same values.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from functools import partial
from itertools import compress
from typing import Any, Callable

import torch
from torch import nn

from neuraldbg.config import DetectorConfig
from neuraldbg.monitor import stats as S
from neuraldbg.monitor.compiled import is_compiling
from neuraldbg.monitor.records import Spec, StepBuffer

#: tensors of one output given a gradient hook at most (a model returning every hidden state)
MAX_OUTPUT_HOOKS = 64
_AS_IS = nullcontext()  # reusable: leaves grad mode as it is


class GradientHooks:
    """The gradient half of :class:`neuraldbg.monitor.hooks.ModuleHooks`, which holds its state
    (the step buffer, the switch, the tables, ``group_params``, ``output_grads``) and inherits
    these. ``output_grads``: whether the model output's gradient notices the passes (else
    parameter hooks do; see the module's docstring)."""

    def _init_gradients(self, root: nn.Module, config: DetectorConfig) -> None:
        """The gradient state, fixed on entry from ``root``'s trainable parameters and ``config``."""
        #: whether a module's parameters share one gradient hook (DetectorConfig.group_param_hooks_above)
        self.group_params = sum(1 for p in root.parameters() if p.requires_grad) > config.group_param_hooks_above
        #: whether the model output's gradient notices the backward passes (else parameter
        #: hooks do: DetectorConfig.param_grad_hooks, or a setup the output cannot see)
        self.output_grads = not config.param_grad_hooks and _OUTPUT_ROUTE
        self._route_misfit = ""  # why the output's gradient cannot notice every pass
        #: layer name -> its trainable parameters' (param index, param), in the order hooked
        self.watched: dict[str, list[tuple[int, nn.Parameter]]] = {}
        self._nodes: tuple[tuple, tuple] | None = None  # their accumulation nodes (_accumulation_nodes)
        self._armed = self._fired = 0  # outputs hooked, output gradients seen, since the last optimizer step
        self._in_root = False  # inside the root's forward on a checked step
        #: id of a hooked parameter -> its module's parameters, where they share its hook
        self._mates: dict[int, tuple[Any, ...]] = {}
        self._pending: tuple | None = None  # the running backward pass's gradients (_open_pass)
        self._plans: dict[tuple, tuple] = {}  # parameter indices -> how their norms are batched

    def _hook_params(self, owner: dict[int, tuple[str, int, nn.Parameter]]) -> None:
        """Watch the parameters in ``owner`` (id -> (layer name, layer index, parameter)): through
        the output's gradient, or with a hook each, or one per module where they share it."""
        by_module: dict[str, list[tuple[int, nn.Parameter]]] = {}
        for name, layer, p in owner.values():
            # a sharded parameter (FSDP2) counts the elements of this rank's shard: its gradient
            # is read there (see _on_param_grad), so the layer's RMS is the shard's
            by_module.setdefault(name, []).append((self.tables.param(layer, S.local_numel(p)), p))
        for name, params in by_module.items():
            self.watched.setdefault(name, []).extend(params)
            self.hooked_params.update(id(p) for _, p in params)
        if self.output_grads and not self._output_route_fits(by_module):
            self.use_param_hooks(self._route_misfit)
        elif self.output_grads:
            self._nodes = None  # rebuilt at the next pass
        else:
            for name, params in by_module.items():
                self._hook_module_params(name, params)

    def _output_route_fits(self, by_module: dict[str, list[tuple[int, nn.Parameter]]]) -> bool:
        """Whether the output's gradient can notice every pass over these parameters (else
        ``_route_misfit`` says why)."""
        for params in by_module.values():
            for _, p in params:
                if S.is_sharded(p):
                    self._route_misfit = "sharded parameters (a shard's gradient is final after its reduce-scatter)"
                    return False
                if p._post_accumulate_grad_hooks:
                    self._route_misfit = "parameters with post-accumulate-grad hooks of their own"
                    return False
        return True

    def use_param_hooks(self, reason: str) -> None:
        """Read gradients from parameter hooks from now on (``reason``: why the model output's
        gradient cannot notice every backward pass), on every parameter watched so far."""
        if not self.output_grads:
            return
        self.output_grads = False
        self._nodes = None
        self._report(("param hooks",), f"{reason}: parameter gradients are read from parameter hooks "
                     "from now on", level=logging.INFO)
        for name, params in self.watched.items():
            self._hook_module_params(name, params)

    def _hook_module_params(self, name: str, params: list[tuple[int, nn.Parameter]]) -> None:
        """A hook on each of a module's parameters ``params`` (``(param index, param)``), or one
        they share."""
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

    def forget_params(self, name: str) -> list[tuple[int, nn.Parameter]]:
        """Stop watching the parameters of layer ``name`` (its module left the model); they are
        returned."""
        self._nodes = None
        return self.watched.pop(name, [])

    def accumulated_with(self, param: Any) -> tuple[Any, ...]:
        """The parameters whose gradients a backward pass may have accumulated by the time
        ``backward_started(param)`` is called: none where the output's gradient noticed the pass
        (``param`` None), else ``param``'s module's where they share its hook, else ``param``."""
        if param is None:
            return ()
        return self._mates.get(id(param), (param,))

    # ---- the output's gradient ---------------------------------------------------------
    def _root_forward_ended(self, output: Any) -> None:
        """A checked, graph-building forward of the root returned ``output`` (its hook)."""
        traced = is_compiling()
        if not traced:  # read by the output hooks only outside torch.compile
            self._in_root = False
        try:
            self.arm_output(output, traced)
        except Exception as e:  # noqa: BLE001 - the monitor must not raise into training
            self._fail(("output gradient", type(e).__name__), f"the output's gradient hook failed: {e!r}")

    def _ran_outside_root(self, module: Any) -> None:
        """A monitored ``module`` ran, outside the root's forward and outside torch.compile."""
        if module is not self.root and _graph_task_id() == -1:
            # a sub-network called outside the root's forward (a GAN's players, a Lightning
            # module's self.model): the root's output does not see its backward passes (a
            # forward run again inside a backward is activation checkpointing's recomputation)
            self.use_param_hooks("a layer ran outside the model's forward (a loop that calls its sub-networks)")

    def _ran_without_grad(self, spec: Spec) -> None:
        """The module of ``spec`` ran in training mode under no_grad on a checked step."""
        if spec.name in self.watched and not is_compiling():
            # reentrant activation checkpointing runs it again inside a backward of its own,
            # which the output's pass does not see
            self.use_param_hooks("a layer with trainable parameters ran under no_grad in training "
                                 "mode (reentrant activation checkpointing)")

    def arm_output(self, output: Any, traced: bool) -> None:
        """A checked forward of the root returned ``output``: hook the gradient of its tensors
        that require one, through the autograd node that made each (a tensor hook on a leaf or
        under torch.compile; the first that fires opens the pass). An output without such a
        tensor means the loss comes from elsewhere: parameter hooks from now on."""
        tensors = _grad_tensors(output)
        if not tensors:
            if not traced:
                self.use_param_hooks("the model's output holds no tensor that requires a gradient")
            return
        nodes: list = []
        for t in tensors:
            node = None if traced else t.grad_fn
            if node is None:  # a leaf, or traced by torch.compile (which sees tensor hooks only)
                t.register_hook(self._on_output_grad)
            elif not any(node is n for n in nodes):
                # the node that makes it runs when its gradient arrives: a hook on the node is
                # the same signal (the gradient itself is not read) for a fifth of a tensor
                # hook's cost, which builds a handle and a dict per step
                nodes.append(node)
                node.register_prehook(self._on_output_grad)
        if not traced:  # a counter read under torch.compile would be guarded on: recompiles
            self._armed += 1

    def check_output_grads(self) -> None:
        """At an optimizer step: a checked forward hooked its output, yet no backward pass came
        through it since the last step, so the loss was not computed from the model's output
        (a stashed intermediate): parameter hooks from now on."""
        if self.output_grads and self._armed and not self._fired:
            self.use_param_hooks("no backward pass went through the model's output (the loss is "
                                 "computed from elsewhere)")
        self._armed = self._fired = 0

    def _on_output_grad(self, grad: Any) -> None:
        self._fired += 1
        buf = self.buf
        if not buf.active or not self.output_grads:
            return None
        try:
            pend = self._pending
            if pend is not None and pend[0] is buf:
                return None  # another tensor of the output, in a pass already open
            nodes = self._nodes
            if nodes is None:
                nodes = self._nodes = _accumulation_nodes(self.watched)
            # the filter runs in C (no Python frame per parameter: hundreds on a deep stack)
            params = list(compress(nodes[0], map(_will_run, nodes[1])))
            if not params:
                return None  # torch.autograd.grad, or a pass that accumulates none of ours
            pend = self._open_pass(buf, None)
            if pend is not None:
                pend[3].append(params)
        except Exception as e:  # noqa: BLE001 - this runs inside backward(): never raise
            self._fail(("pgrad", type(e).__name__), f"parameter-gradient statistics failed: {e!r}")
        return None

    def _open_pass(self, buf: StepBuffer, param: Any) -> tuple | None:
        """The running backward pass's pending gradients ``(buffer, [param index], [grad],
        [a module's (param index, param) pairs])``, opened at its first hooked gradient (or at
        the output's, ``param`` None); None where no autograd engine runs (no final callback to
        wait for: the caller measures now)."""
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
            if modules:  # every accumulation of this pass is done now: comprehensions, no call per parameter
                # parameter hooks put in while this pass ran (the output's pass, then a switch) have
                # noted some already (rare): each parameter is read once
                noted = set(ids) if ids else ()
                got = [(i, g) for params in modules for i, p in params
                       if (g := p.grad) is not None and i not in noted]
                ids += [i for i, _ in got]
                grads += [g for _, g in got]
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
            # grad mode is off in a backward pass that builds no graph (create_graph=False, the
            # common case): no_grad is then a few Python calls for nothing
            with torch.no_grad() if torch.is_grad_enabled() else _AS_IS:
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

#: whether this torch can tell which accumulation nodes a backward pass runs (the output route)
_OUTPUT_ROUTE = hasattr(torch._C, "_will_engine_execute_node") and hasattr(torch.autograd.graph, "get_gradient_edge")


def _graph_task_id() -> int:
    """The running backward pass's id, -1 outside one."""
    try:
        return torch._C._current_graph_task_id()
    except Exception:  # noqa: BLE001 - an old torch without it: read as outside a backward
        return -1


#: whether the running backward pass will run an accumulation node (torch's own check, called
#: from C by map: where this torch lacks it the output route is off and it is never called)
_will_run = getattr(torch._C, "_will_engine_execute_node", None)


def _accumulation_nodes(watched: dict[str, list[tuple[int, nn.Parameter]]]) -> tuple[tuple, tuple]:
    """``((param index, param) pairs, their gradient accumulation nodes)`` of every watched
    parameter that requires a gradient (a frozen one has no node; none is made for it), as two
    tuples of one order."""
    edge = torch.autograd.graph.get_gradient_edge
    pairs = tuple((i, p) for params in watched.values() for i, p in params if p.requires_grad)
    return pairs, tuple(edge(p).node for _, p in pairs)


def _grad_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a forward's output that require a gradient: the output itself, or those
    of a tuple, list or mapping (a model output object), one level deep, up to
    :data:`MAX_OUTPUT_HOOKS`."""
    if isinstance(output, torch.Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, dict):
        items = list(output.values())
    elif isinstance(output, (tuple, list)):
        items = list(output)
    else:
        return []
    out: list[torch.Tensor] = []
    for x in items:
        for t in (x,) if isinstance(x, torch.Tensor) else x if isinstance(x, (tuple, list)) else ():
            if isinstance(t, torch.Tensor) and t.requires_grad:
                out.append(t)
                if len(out) >= MAX_OUTPUT_HOOKS:
                    return out
    return out


def _queue_at_backward_end(fn: Callable[[], None]) -> bool:
    """Run ``fn`` when the running backward pass ends (False when there is none)."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(fn)
        return True
    except RuntimeError:
        return False
