"""The monitor's hooks: registration, the callbacks, the per-step buffer they fill, module swaps.

Hooks observe, they never patch ``forward``. On a checked step each module output costs a
few reductions on the device under ``torch.no_grad()`` (:mod:`neuraldbg.monitor.stats`); a
small output is held and measured with the others when the forward ends
(:mod:`neuraldbg.monitor.held`: a few kernels for a hundred layers). Every parameter
gradient of one backward pass is measured at once, by one ``torch._foreach_norm`` queued to
run when that backward ends (after accumulation, before clipping or the optimizer), noticed by
a hook on the gradient of the model's output (:mod:`neuraldbg.monitor.gradhooks`). On an
unchecked step the module hooks are out of the model
(:mod:`neuraldbg.monitor.switch`) and the root's input hook only reads tensor metadata.
Nothing is moved to the host per hook. A callback never raises into training: a failure is
reported once and, for a module's output, disables that module's statistics.

A statistic over zero elements is *missing*, not zero: an output without elements records
no value (and the parameter gradients of a module that only saw empty inputs in a step are
not read as vanished), and the loss of an empty batch is no observation.
"""
from __future__ import annotations

import logging
import weakref
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from neuraldbg.config import DetectorConfig
from neuraldbg.monitor import stats as S
from neuraldbg.monitor.compiled import guard_compiled_hooks, is_compiling
from neuraldbg.monitor import held as held_outputs
from neuraldbg.monitor.held import HeldOutputs
from neuraldbg.monitor.inputhooks import InputHooks
from neuraldbg.monitor.records import (INPUT, OUT, Block, Spec, StepBuffer, Tables, describe, first_tensor,
                                       monitored_modules)
from neuraldbg.monitor.switch import ALWAYS, EVERY_GROUP, HookSwitch


class ModuleHooks(InputHooks):
    """The hooks on one model and the step buffer they fill.

    Lifecycle: :meth:`register` when the monitor is entered, :meth:`remove` when it exits.
    In between the owner frames steps with :meth:`start_step` and :meth:`take`, and calls
    :meth:`check_modules` now and then to follow modules added or swapped in mid-run.
    ``report(key, msg, level)`` logs a problem once per key; ``fail(key, msg)`` does the same for
    a failure of the monitor's own statistics and counts it (``dbg.internal_errors``, the coverage
    of ``docs/api.md``): a layer whose statistics fail is missing from the diagnosis, and says so.
    """

    def __init__(self, root: nn.Module, *, schedule: Any, config: DetectorConfig, scaler: Any,
                 report: Callable[..., None], backward_started: Callable[[Any], None] | None = None,
                 fail: Callable[[tuple, str], None] | None = None) -> None:
        self.root = root
        #: which steps are checked (``neuraldbg/monitor/cadence.py``): the owner decides at each
        #: step's start; the rotation of the output shares counts its checks
        self.schedule = schedule
        self.margin = config.saturation_margin
        self.softmax_margin = config.softmax_saturation_margin
        self.scaler = scaler
        self._report = report
        self._fail = fail if fail is not None else report
        #: called with the first parameter whose gradient a backward pass accumulates (checked
        #: steps): every other parameter still holds what it held before the pass
        self.backward_started = backward_started
        self.eval_trains = False  # set when the model is trained in eval() mode (then eval forwards count)
        # layer name -> (weak ref to the hooked module, its hook handles): how replaced or renamed
        # modules are noticed and unhooked (weak: an orphan is freed); their parameters: watched
        self.hooked: dict[str, tuple[Any, list]] = {}
        self.hooked_params: set[int] = set()
        self.handles: list[Any] = []
        self.switch = HookSwitch()  # takes the hooks out of the model on unchecked steps
        # the sub-network entry hooks: out on unchecked steps, and once the root's forward ran
        self.entries = HookSwitch()
        # whether a checked step puts them in: until a checked forward ran the root (a loop that
        # calls the root never needs them; putting them in and out again costs a dict operation
        # per child per check, a few hundred for a flat Sequential), and again after a checked
        # forward that did not run it (that step's model input is then read from the next check)
        self.entries_needed = True
        self.modules = monitored_modules(root)
        #: rotating shares of the output hooks (1: every module on every checked step), fixed
        #: on entry from the module count (DetectorConfig.rotate_modules_above)
        self.shares = rotation_shares(len(self.modules), config.rotate_modules_above, config.rotation_max_shares)
        self._init_gradients(root, config)
        self._n_out_hooks = 0  # output hooks registered so far (the next one's share)
        self.kinds = {name: S.activation_kind(m) for name, m in self.modules}
        self.disabled: set[str] = set()
        self.tables = Tables()
        for name, _ in self.modules:
            self.tables.layer(name)
        # forward order of first measurement, kept here so that closing a step is O(1)
        self.order: list[str] = []
        self.order_pos: dict[str, int] = {}
        self.batch_empty = False  # the latest training forward's input had no elements
        self.buf = StepBuffer(0, True, self.tables)
        #: small outputs held to the end of the forward and measured together
        self.held = HeldOutputs(report, self._fail, self._disable)

    # ---- lifecycle -------------------------------------------------------------------
    def register(self, entries: bool = True, parallel: bool = False) -> None:
        """Hook the model input and every monitored module (raises if torch refuses a hook).

        ``entries``: also hook the inputs of the root's direct children. A training loop that
        calls its sub-networks directly (a GAN's generator and discriminator, a Lightning
        module's ``self.model``) never runs the root's forward, so their inputs are the
        model's input; they count only in steps where the root's forward did not run.
        ``parallel``: the model is wrapped for data parallelism (DataParallel, DDP) or
        ``torch.distributed`` is initialized: gradients are read from parameter hooks, where a
        rank's own gradient is final before any reduction.
        """
        guard_compiled_hooks()
        if parallel:
            self.use_param_hooks("data-parallel training (a rank's own gradient is final before any reduction)")
        if self.shares > 1:
            self._report(("shares",), f"{len(self.modules)} monitored modules: their outputs are measured in "
                         f"{self.shares} rotating shares, each layer once every {self.shares} checks (parameter "
                         "gradients on every check; DetectorConfig.rotate_modules_above)", level=logging.INFO)
        self.handles.append(self.root.register_forward_pre_hook(self._on_input, with_kwargs=True))
        # the end of the root's forward measures the outputs held (checked steps only)
        h = self.root.register_forward_hook(self._on_root_output)
        self.handles.append(h)
        self.switch.add(h, self._on_root_output)
        # each child's first monitored layer, in one pass (a lookup per child would be quadratic
        # in the depth of a flat Sequential)
        firsts: dict[str, str] = {}
        for n, _ in self.modules:
            firsts.setdefault(n.split(".", 1)[0], n)
        for cname, child in self.root.named_children() if entries else ():
            first = firsts.get(cname)
            if first is not None:  # the entry's records name its first monitored layer
                hook = partial(self._on_entry, self.tables.slot(INPUT, self.tables.layer(first)))
                h = child.register_forward_pre_hook(hook, with_kwargs=True)
                self.handles.append(h)
                self.entries.add(h, hook)
        self._hook_modules(self.modules)

    def remove(self) -> None:
        """Remove every hook handle registered so far (safe to call twice)."""
        for h in self.handles:
            try:
                h.remove()
            except Exception:  # pragma: no cover - removal of a dead handle is harmless
                pass
        self.handles.clear()
        self._mates.clear()  # it holds the model's parameters
        self.watched.clear()
        self._nodes = None
        self.switch = HookSwitch()
        self.entries = HookSwitch()
        self.held.clear()

    def start_step(self, step: int, active: bool) -> None:
        """Start recording ``step``, measured when ``active`` (the schedule's decision); the
        module and parameter hooks are only in the model during checked steps (of a model
        with rotating shares, the output hooks of this check's share)."""
        self.flush()
        self.buf = StepBuffer(step, active, self.tables)
        if self.handles:
            self.switch.set(active, self.share_of(step))
            self.entries.set(active and self.entries_needed)
        self.batch_empty = False
        self._pending = None
        self._in_root = False

    def next_unchecked(self, step: int) -> None:
        """Start an unchecked ``step`` after an unchecked step whose buffer recorded nothing (its
        loss went straight to the queue): the hooks are already out, nothing is held, and the
        buffer, which never left this object, is reset rather than made anew
        (:meth:`start_step` without the switches)."""
        self.buf.restart(step)
        self.batch_empty = False
        self._pending = None

    def share_of(self, step: int) -> Any:
        """The output-hook share a checked ``step`` measures: every module while there is one
        share, and until a forward was measured (the first check records the forward order
        of every layer); then share ``(check index) % shares`` (``step // every`` at a fixed
        interval), so that consecutive checks cover every module within ``shares`` checks."""
        if self.shares <= 1 or not self.order:
            return EVERY_GROUP
        return self.schedule.check_index(step) % self.shares

    def take(self) -> StepBuffer | None:
        """The current step's buffer if anything was recorded (None otherwise).

        Hooks that fire later in the same step fill a fresh buffer of that step.
        """
        self.flush()
        buf = self.buf
        if buf.entry and not buf.root_called:  # the sub-networks were the model's entry points
            buf.records.extend(buf.entry)
        if buf.active and (buf.root_called or buf.n_fwd):
            self.entries_needed = not buf.root_called
        if buf.empty():
            return None
        self.buf = StepBuffer(buf.step, buf.active, self.tables)
        if buf.traced:  # compiled hooks leave the forward order to be read here
            slots, names = self.tables.slots, self.tables.names
            for r in buf.records:
                if type(r) is Block:  # measured outside torch.compile: its order is known
                    continue
                group, layer = slots[r[0]][:2]
                if group == OUT and names[layer] not in self.order_pos:
                    self._add_order(names[layer])
        return buf

    def _add_order(self, name: str) -> None:
        self.order_pos[name] = len(self.order)
        self.order.append(name)

    def add_loss(self, value: Any) -> None:
        """Record a loss (float or 0-d tensor) in the current step, unless the batch it was
        computed on had no elements: a mean over nothing is no observation."""
        if self.batch_empty:
            self._report(("empty_batch",), f"a batch with no elements at step {self.buf.step}: its loss and "
                         "statistics are missing for that step, not values", level=logging.INFO)
            return
        self.buf.losses.append(value)

    def _hook_modules(self, modules: list[tuple[str, nn.Module]]) -> None:
        owner: dict[int, tuple[str, int, nn.Parameter]] = {}
        for name, mod in modules:
            layer = self.tables.layer(name)
            fn = partial(self._on_output, Spec(name, mod, layer, self.tables))
            h = mod.register_forward_hook(fn)
            self.handles.append(h)
            self.switch.add(h, fn, self._n_out_hooks % self.shares if self.shares > 1 else ALWAYS)
            self._n_out_hooks += 1
            self.hooked[name] = (weakref.ref(mod), [h])
            for p in mod.parameters(recurse=False):
                # a tensor subclass other than a sharded DTensor is not measured: coverage says so.
                # A shard with no elements on this rank (uneven sharding) has no gradient to read.
                if p.requires_grad and id(p) not in owner and id(p) not in self.hooked_params \
                        and S.measurable(p) and S.local_numel(p) > 0:
                    owner[id(p)] = (name, layer, p)
        self._hook_params(owner)

    def check_modules(self) -> list[str] | None:
        """Hook modules added or swapped in since the last check (log once per layer name).

        Returns the names of the layers that got a new module (the owner's detectors must
        forget what they learned about them), or None when the model is unchanged or the
        hooks are not active. A replaced layer keeps its name but gets a new module; its old
        hooks stay on the orphan until :meth:`remove`.
        """
        if not self.handles:
            return None  # not active (or registration failed): nothing to keep in sync
        current = monitored_modules(self.root)
        now = dict(current)
        stale = [n for n, (ref, _) in self.hooked.items() if now.get(n) is None or ref() is not now[n]]
        new = [(n, m) for n, m in current if n not in self.hooked or self.hooked[n][0]() is not m]
        if not new and not stale:
            return None
        self._nodes = None  # rebuilt at the next pass (a parameter may have been unfrozen)
        for name in stale:
            # the module left the model or moved under another name (e.g. wrapped by an
            # adapter): its hooks would report under a wrong or dead name
            _, handles = self.hooked.pop(name)
            pids = [id(p) for _, p in self.forget_params(name)]
            self.switch.forget(handles)
            for h in handles:
                h.remove()
            self.hooked_params.difference_update(pids)
            for pid in pids:
                self._mates.pop(pid, None)
        for name, mod in new:
            self.kinds[name] = S.activation_kind(mod)
            self._report(("replaced", name), f"module {name} was added or replaced during training "
                         f"(now {type(mod).__name__}); monitoring the new module", level=logging.INFO)
        self.modules = current
        self._hook_modules(new)
        return [name for name, _ in new]

    # ---- callbacks (the model input's: neuraldbg/monitor/inputhooks.py) ------------------
    def _on_output(self, spec: Spec, module, inputs, output):
        # the checks of _skip_forward, inlined: this runs once per module per checked step
        buf = self.buf
        if not buf.active:
            return None
        train = self.root.training or self.eval_trains
        if not torch.is_grad_enabled():
            if train:
                # a training-mode forward under no_grad: the module ran, cut from the loss (a
                # host-side note, no kernel; the loop checks read it)
                buf.ran_without_grad.add(spec.layer)
                if self.output_grads:
                    self._ran_without_grad(spec)
            return None
        if spec.name in self.disabled:
            return None
        if not train:
            buf.eval_skipped = True
            return None
        try:
            y = output if type(output) is torch.Tensor else first_tensor(output)
            if y is None or not y.is_floating_point() or y.is_sparse:
                self._report((spec.name, "type"), f"no statistics for the output of {spec.name} "
                             f"({describe(output)}); skipped", level=logging.INFO)
                return None
            n = y.numel()
            if n == 0:
                buf.records.append((spec.empty, 0, ()))
                self._report((spec.name, "empty"), f"the output of {spec.name} had no elements at step "
                             f"{buf.step}: its statistics are missing on such steps, not zero", level=logging.INFO)
                return None
            # under torch.compile every Python dict this hook reads is guarded: one that grows
            # (new unit counts, the forward order) would recompile, so those wait for the host
            traced = is_compiling()
            if not traced and self.output_grads and not self._in_root:
                self._ran_outside_root(module)
            # True: measured at the flush (a large output never waits: no call for it; the
            # module's bound, which HeldOutputs.hold applies to every caller)
            held = not traced and n <= held_outputs.DEFER_NUMEL and self.held.hold(spec, y, n, buf)
            if not held:
                # output_stats reads y.detach(): no graph, no grad-mode switch needed
                x = first_tensor(inputs) if spec.kind == "softmax" else None
                vals = S.output_stats(y, spec.kind, sq=spec.sq, bounds=spec.bounds, softmax_dim=spec.dim,
                                      margin=self.margin, softmax_margin=self.softmax_margin, traced=traced, x=x)
                slot = spec.out
                if spec.kind == "relu" and not traced:  # per-unit maxima: a slot per unit count
                    slot = spec.relu_slot(vals[0].numel())
                buf.records.append((slot, n, vals))
            buf.n_fwd += 1
            if traced:
                buf.traced = True
            elif spec.name not in self.order_pos:
                self._add_order(spec.name)
            if held and self.held.full():
                self.flush()
        except Exception as e:  # noqa: BLE001
            self._disable(spec, e)
        return None

    def _disable(self, spec: Spec, e: BaseException) -> None:
        """A module's statistics failed: report it once and stop measuring that module."""
        self.disabled.add(spec.name)
        self._fail((spec.name, type(e).__name__), f"statistics of {spec.name} failed and are disabled: {e!r}")

    def flush(self) -> None:
        """Measure the outputs held so far (:meth:`HeldOutputs.flush`)."""
        self.held.flush()

    def _on_root_output(self, module, inputs, output):
        self.flush()
        if self.output_grads and self.buf.active and torch.is_grad_enabled():
            self._root_forward_ended(output)
        return None


# ---- helpers --------------------------------------------------------------------------

def rotation_shares(n_modules: int, above: int, most: int) -> int:
    """How many rotating shares the output hooks of ``n_modules`` monitored modules are split
    into: 1 (every module on every checked step) up to ``above`` modules, else the fewest
    shares of at most ``above`` modules each, but never more than ``most``."""
    return 1 if n_modules <= above else min(most, -(-n_modules // above))
