"""The training loop's own bugs, measured on checked steps (the ``training_loop`` signatures).

What each check reads and why it is exact is in ``neuraldbg/causal/nodes/loop.py``; here is how
it is measured without a host sync per hook (device values wait and go to the host with the
monitor's own transfers, every ``sync_every`` checked steps):

* **stale gradients** -- over the first :data:`STALE_WINDOW` checked optimizer steps, at the start
  of every backward pass of a checked step (its first
  accumulated gradient), for each optimizer stepping the model: did it step since the previous
  backward start, and do its parameters (a sample of :data:`SAMPLE`) still hold gradients? A
  present gradient is summed into one device norm (none present, as after
  ``zero_grad(set_to_none=True)``: no kernel at all). On the host the events replay in order:
  a step taken while its parameters still hold gradients from before its previous step (never
  zeroed since) is stale. Accumulation (several backwards, then a step, then ``zero_grad``) and
  a GAN's cross-gradients (zeroed before the discriminator's own step) stay quiet. The replay
  needs the *first* backward after a step: where the step open at the optimizer's step is not
  the checked one now backing up and an unchecked step may lie between (``every > 1``, or
  ``every="auto"`` outside a dense window), an unchecked step came between and its
  backward passes were not seen (accumulation over unchecked micro-steps would look stale), so
  that step is not judged, and not counted as examined.
* **orphans** -- at the first :data:`WINDOW` checked optimizer steps, which trainable parameters
  of the model as it is then hold a gradient (host-side ``.grad is not None``, a walk of the
  model's parameters: a head swapped in after entry counts from its first step); at the end,
  those no optimizer holds.
* **detached** -- over the first :data:`WINDOW` checked steps with a backward, which layers ran
  in training mode (their output was measured, or they ran under ``no_grad``) and which received
  gradients; at the end, the optimized parameters of layers that ran but never got one.
* **probabilities** -- on the first :data:`STALE_WINDOW` checked steps, whether the model's output
  rows lie in [0, 1] and sum to 1: three reductions over the output, one device flag per step.

The parameter windows open again for :data:`WINDOW` steps when the monitor notices a module
added or replaced mid-run (its module list changes, ``neuraldbg/monitor/hooks.py``): a head
replaced after the optimizer was built is a loop bug made at that point, not at the start.

Every check looks at a window at the start of the run: a loop bug is in the code, so it shows from
the first steps, and the checks then cost nothing for the rest of the run.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from neuraldbg.causal.nodes.loop import (DETACHED_LAYER, DETACHED_PARAMS, LOOP_CHECKED, ORPHAN_LAYER, ORPHAN_PARAMS,
                                         PROB_SHARE_SIG, STALE_CHECKED, STALE_STEPS)
from neuraldbg.lifecycle import AddonContext, Measurement
from neuraldbg.monitor import stats as S
from neuraldbg.monitor.measurements import register_measurement
from neuraldbg.monitor.records import first_tensor, monitored_modules

#: checked steps the parameter checks (orphans, detached) look at: a structural bug shows from
#: the first step, and later steps would only cost time
WINDOW = 8
#: checked optimizer steps the stale check examines, and checked steps whose output is examined
#: (enough for a few cycles of gradient accumulation)
STALE_WINDOW = 16
#: parameters per optimizer whose gradients the stale check reads (the condition is the
#: optimizer's: zero_grad clears all of its parameters or none)
SAMPLE = 32
#: tolerance of the probability-row check (float rounding of a softmax in float32)
ROW_TOL = 1e-3


def row_tolerance(dtype: torch.dtype) -> float:
    """How far a softmax row of ``dtype`` may sum from 1: each probability is rounded to the
    dtype (relative error up to ``eps/2``), so the float32 sum of a row is within ``eps/2`` of 1;
    ``eps`` leaves a factor 2. Under bf16 autocast that is 0.0078, where ``ROW_TOL`` would miss
    every row."""
    return max(ROW_TOL, float(torch.finfo(dtype).eps)) if dtype.is_floating_point else ROW_TOL

NO_OPTIMIZER = "no optimizer stepped the model's parameters on a checked step"


@register_measurement
class LoopWatch(Measurement):
    """The loop checks of one monitor (see the module docstring)."""

    signatures = (STALE_STEPS, STALE_CHECKED, ORPHAN_PARAMS, ORPHAN_LAYER, DETACHED_PARAMS, DETACHED_LAYER,
                  LOOP_CHECKED, PROB_SHARE_SIG)
    #: every optimizer step is counted (the stale check asks "stepped since") until the stale
    #: window is full; the rest waits for checked steps
    unchecked = ("optimizer_post",)

    def __init__(self) -> None:
        self._ctx: AddonContext | None = None
        self._layer_of: dict[int, str] = {}   # id(trainable parameter) -> the layer that owns it
        self._mods: Any = None                # the monitor's module list these map (replaced when it changes)
        self._handle: Any = None
        # stale gradients: events replayed on the host, in order
        self._opt_steps: dict[int, int] = {}  # id(optimizer) -> its steps so far (every step)
        self._at_bwd: dict[int, int] = {}     # id(optimizer) -> its steps at the last checked backward start
        self._open: dict[int, bool] = {}      # id(optimizer) -> a stale candidate may be open (host side)
        self._events: list[list[Any]] = []    # ["bwd", id, stepped, z] / ["opt", id]; stepped None: not judged
        self._cand: dict[int, bool | None] = {}
        self._step_at: dict[int, int] = {}    # id(optimizer) -> the step open at its last step
        self.stale = self.examined = 0
        self._opt_events = 0                  # "opt" events recorded (examined once flushed)
        self._at: dict[str, int] = {}         # check -> the step of its last observation
        # orphans and detached layers, over the first WINDOW checked steps
        self._opt_checked = 0
        self._opt_until = WINDOW              # the parameter windows end at these counts
        self._with_grad: set[int] = set()
        self._bwd_steps = 0
        self._bwd_until = WINDOW
        self._ran: set[str] = set()
        self._got_grad: set[str] = set()
        # probability rows: device flags until a transfer
        self._prob_pending: list[torch.Tensor] = []
        self._prob_n = self._prob_yes = 0

    # ---- lifecycle -----------------------------------------------------------------------
    def enter(self, ctx: AddonContext) -> None:
        """Map every trainable parameter to its layer (first owner, as the hooks do) and watch the
        model's output."""
        self._ctx = ctx
        self._map(ctx.modules)
        self._handle = ctx.root.register_forward_hook(self._on_output)
        ctx.checked_only(self._handle, self._on_output)  # it reads checked forwards only

    def _map(self, modules: Any) -> None:
        self._mods = modules
        for name, mod in modules:
            for p in mod.parameters(recurse=False):
                if p.requires_grad and id(p) not in self._layer_of:
                    self._layer_of[id(p)] = name

    def _on_output(self, module: Any, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return None  # a graph break per step otherwise: the check is off under torch.compile
        ctx = self._ctx
        if not ctx.measuring() or self._prob_n + len(self._prob_pending) >= STALE_WINDOW:
            return None
        try:
            y = first_tensor(output)
            if y is None:
                y = getattr(output, "logits", None)
            if isinstance(y, torch.Tensor) and y.is_floating_point() and y.dim() >= 1 and y.shape[-1] >= 2 \
                    and y.numel() > 0:
                with torch.no_grad():
                    tol = row_tolerance(y.dtype)
                    yd = y.detach().float()
                    rows = (yd.sum(-1) - 1).abs().amax() <= tol
                    self._prob_pending.append(((yd.amin() >= -tol) & (yd.amax() <= 1 + tol) & rows).float())
                self._at["prob"] = ctx.step
        except Exception as e:  # noqa: BLE001 - never raise into training
            ctx.report(("loop", "output", type(e).__name__), f"the output check failed: {e!r}", logging.INFO)
        return None

    def backward_started(self, ctx: AddonContext, param: Any) -> None:
        """Record, per optimizer, whether it stepped since the previous backward start and whether
        its parameters still hold gradients (those this pass accumulated first excluded)."""
        if self._opt_events >= STALE_WINDOW:
            return
        for opt in ctx.optimizers:
            oid = id(opt)
            n = self._opt_steps.get(oid, 0)
            stepped = n != self._at_bwd.get(oid, 0)
            self._at_bwd[oid] = n
            if not stepped and not self._open.get(oid):
                continue  # nothing can open or close a candidate here
            at = self._step_at.get(oid)
            if stepped and at != ctx.step and not ctx.checked_since(ctx.step if at is None else at):
                # a step taken in an earlier step than this one, with an unchecked step between
                # (every > 1, or every="auto" outside its dense windows), whose backward passes
                # (a micro-batch's, or a zero_grad then a backward) were not seen: the gradients
                # here may be a legitimate accumulation. Not judged.
                self._open[oid] = False
                self._events.append(["bwd", oid, None, 0.0])
                continue
            # a sharded gradient (FSDP2) is read on this rank's shard: the check asks only
            # whether gradients are still held, and every rank holds a shard of each
            # the first accumulated gradient, and its module's where they share its hook, are this pass's
            fresh = {id(q) for q in ctx.accumulated_with(param)}
            grads = [S.local(p.grad) for p in self._sample(ctx, opt) if id(p) not in fresh and p.grad is not None]
            if grads:
                with torch.no_grad():
                    z: Any = S.grad_norms(grads).sum()
            else:
                z = 0.0
            self._open[oid] = bool(grads)
            self._events.append(["bwd", oid, stepped, z])

    def _sample(self, ctx: AddonContext, opt: Any) -> list[Any]:
        out = []
        for p in ctx.params_of(opt):
            if p.requires_grad:  # not the layer map: a module swapped in is mapped only later
                out.append(p)
                if len(out) >= SAMPLE:
                    break
        return out

    def optimizer_pre(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """A checked step of an optimizer: an event for the stale check, and which parameters hold
        gradients (first checked steps)."""
        if not checked:
            return
        if self._opt_events < STALE_WINDOW:
            self._opt_events += 1
            self._events.append(["opt", id(optimizer)])
            self._at["stale"] = ctx.step
            if self._opt_events >= STALE_WINDOW:
                # the stale check's window is full: the backward starts and the step counts that
                # fed it are heard no more, checked steps included
                ctx.hook_done(self, "optimizer_post")
                ctx.hook_done(self, "backward_started")
        if self._opt_checked < self._opt_until:
            self._opt_checked += 1
            # the model as it is now (host-side attributes only): the layer map is refreshed only
            # when the monitor's periodic module check notices a change
            self._with_grad.update(id(p) for p in ctx.root.parameters() if p.requires_grad and p.grad is not None)
            self._at["params"] = ctx.step

    def optimizer_post(self, ctx: AddonContext, optimizer: Any, checked: bool) -> None:
        """Count every step (checked or not): the stale check asks "stepped since"; and note the
        step open now (the backward passes after it are seen only if it is checked)."""
        self._opt_steps[id(optimizer)] = self._opt_steps.get(id(optimizer), 0) + 1
        self._step_at[id(optimizer)] = ctx.step

    def checked_step(self, ctx: AddonContext, stats: Any) -> None:
        """Which layers ran and which received gradients, over the first checked steps (and again
        after a module was added or replaced)."""
        if ctx.modules is not self._mods:
            # the monitor swapped in its new module list (a layer added or replaced mid-run):
            # map the new parameters and look again, a window's worth of steps
            self._map(ctx.modules)
            self._opt_until = self._opt_checked + WINDOW
            self._bwd_until = self._bwd_steps + WINDOW
        if not stats.has_backward or self._bwd_steps >= self._bwd_until:
            return
        self._bwd_steps += 1
        self._at["detached"] = ctx.step
        names = stats.names
        self._ran.update(names[i] for i in stats.has_out.nonzero()[0])
        self._ran.update(stats.ran_without_grad)
        self._got_grad.update(names[i] for i in stats.has_pgrad.nonzero()[0])

    def step_closed(self, ctx: AddonContext, step: int, checked: bool) -> None:
        """Move the waiting device values to the host once ``sync_every`` steps' worth wait."""
        if len(self._prob_pending) >= ctx.sync_every or len(self._events) >= 8 * ctx.sync_every:
            self.flush(ctx)

    def flush(self, ctx: AddonContext | None = None) -> None:
        """One host transfer of the waiting device values; replay the stale events."""
        tensors = [e[3] for e in self._events if e[0] == "bwd" and isinstance(e[3], torch.Tensor)]
        tensors += self._prob_pending
        if tensors:
            dev = tensors[0].device
            host = iter(torch.stack([t.float().reshape(()).to(dev) for t in tensors]).cpu().tolist())
            for e in self._events:
                if e[0] == "bwd" and isinstance(e[3], torch.Tensor):
                    e[3] = next(host)
            flags = [next(host) for _ in self._prob_pending]
            self._prob_yes += sum(f > 0.5 for f in flags)
            self._prob_n += len(flags)
            self._prob_pending = []
            if self._prob_n >= STALE_WINDOW and self._handle is not None:
                # the output check is complete: its root hook would only return at once
                self._ctx.release(self._handle)
                self._handle = None
        for e in self._events:
            if e[0] == "bwd":
                _, oid, stepped, z = e
                if stepped is None:
                    self._cand[oid] = None   # not judged (see backward_started)
                elif z == 0.0:
                    self._cand[oid] = False  # zeroed (or never had a gradient)
                elif stepped:
                    self._cand[oid] = True   # stepped, yet the gradients are still there
            elif self._cand.get(e[1], False) is not None:
                self.examined += 1
                self.stale += bool(self._cand.get(e[1]))
        self._events = []

    def exit(self, ctx: AddonContext, exc: BaseException | None) -> None:
        """Remove the output hook; read what waits."""
        if self._handle is not None:
            ctx.release(self._handle)
            self._handle = None
        self.flush(ctx)

    # ---- results -------------------------------------------------------------------------
    def _first_layer(self, ids: set[int]) -> str | None:
        order = {n: i for i, n in enumerate(self._ctx.order)} if self._ctx is not None else {}
        if self._ctx is not None and any(i not in self._layer_of for i in ids):
            # a parameter of a module swapped in that the monitor has not mapped yet
            self._map(monitored_modules(self._ctx.root))
        layers = {self._layer_of[i] for i in ids if i in self._layer_of}
        return min(layers, key=lambda n: (order.get(n, len(order)), n)) if layers else None

    def _held(self) -> set[int]:
        ctx = self._ctx
        return {id(p) for opt in ctx.optimizers for p in ctx.params_of(opt)} if ctx is not None else set()

    def summary(self) -> dict[Any, Any]:
        """The counts, the first layers, the share of probability rows (one host transfer)."""
        self.flush()
        out: dict[Any, Any] = {}
        if self.examined:
            out[STALE_STEPS], out[STALE_CHECKED] = self.stale, self.examined
        held = self._held()
        if self._opt_checked and held:
            out[LOOP_CHECKED] = self._opt_checked
            orphans = self._with_grad - held
            out[ORPHAN_PARAMS] = len(orphans)
            if orphans:
                out[ORPHAN_LAYER] = self._first_layer(orphans)
            if self._bwd_steps and self._got_grad:
                cut = {i for i, layer in self._layer_of.items()
                       if layer in self._ran and layer not in self._got_grad and i in held}
                out[DETACHED_PARAMS] = len(cut)
                if cut:
                    out[DETACHED_LAYER] = self._first_layer(cut)
        if self._prob_n:
            out[PROB_SHARE_SIG] = self._prob_yes / self._prob_n
        return out

    def steps(self) -> dict[Any, int]:
        """Each check's values are known from the step of its last observation on (a timeline
        cut before it does not see them)."""
        at = self._at
        out: dict[Any, int] = {}
        if "stale" in at:
            out[STALE_STEPS] = out[STALE_CHECKED] = at["stale"]
        if "params" in at:
            out[LOOP_CHECKED] = out[ORPHAN_PARAMS] = out[ORPHAN_LAYER] = at["params"]
            last = max(at["params"], at.get("detached", at["params"]))
            out[DETACHED_PARAMS] = out[DETACHED_LAYER] = last
        if "prob" in at:
            out[PROB_SHARE_SIG] = at["prob"]
        return out

    def gaps(self) -> dict[Any, str]:
        """Why a check read nothing."""
        out: dict[Any, str] = {}
        if not self._held() or not self._opt_checked:
            for sig in (STALE_STEPS, STALE_CHECKED, ORPHAN_PARAMS, DETACHED_PARAMS, LOOP_CHECKED):
                out[sig] = NO_OPTIMIZER
        elif self._opt_events and not self.examined and not self._events:
            for sig in (STALE_STEPS, STALE_CHECKED):
                out[sig] = ("no optimizer step could be judged: an unchecked step (every > 1) was open after each "
                            "step, so the backward passes that followed it were not seen")
        if not self._prob_n:
            out[PROB_SHARE_SIG] = ("the model's output was never examined (its forward was not the entry point, "
                                   "or it ran under torch.compile)")
        return out
