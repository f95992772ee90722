"""The sentences of a diagnosis: what a hypothesis says, how to fix it, what was not observed.

Pure functions of the trace and its evidence, kept apart from the ranking
(:mod:`.hypotheses`), so the wording of every state lives in one place.
"""
from __future__ import annotations

import math

from neuraldbg.causal.compiled import CompiledNetwork
from neuraldbg.causal.evidence import Evidence
from neuraldbg.causal.nodes.causes import retention_not_kept
from neuraldbg.causal.nodes.loop import ORPHAN_PARAMS
from neuraldbg.causal.nodes.numerics import WEIGHTS_DTYPE
from neuraldbg.causal.nodes.run import LR, LR_PEAK
from neuraldbg.trace import Trace
from neuraldbg.vocab import phrase

#: an unobserved variable is worth naming in a hypothesis when, had it been observed, its
#: likelihood under the hypothesis would differ from a healthy run's by this much (total variation)
RELEVANT_TV = 0.3


def headline(cause: str, state: str, p: float) -> str:
    """The head of a hypothesis' sentence: "learning rate too high (p = 0.97)"."""
    return f"{phrase(cause, state)} (p = {p:.2f})"


def describe(cause: str, state: str, p: float, failure_type: str, layer: str | None, step: int | None,
             rank: int | None = None) -> str:
    """One sentence naming cause, state, probability, failure type, layer, step (and rank)."""
    what = failure_type.replace("_", " ")
    where = f"layer `{layer}`" if layer is not None else "the loss (no layer event)"
    when = f"step {step}" if step is not None else "an unknown step"
    on = f" on rank {rank}" if rank is not None else ""
    return f"{headline(cause, state, p)}: {what} first seen in {where} at {when}{on}."


def _lr_text(trace: Trace) -> str:
    """The rate a fix should start from: the peak of the schedule (``lr_peak``), since a decayed
    schedule ends near 0 and "10x lower than the end" would mean nothing; the current rates
    when the schedule never went above them (a constant rate)."""
    lrs = trace.signatures.value(LR)
    now: list[float] = []
    if isinstance(lrs, (list, tuple)):
        try:
            now = sorted({float(x) for x in lrs if math.isfinite(float(x))})
        except (TypeError, ValueError):
            now = []
    peak = trace.signatures.number(LR_PEAK)
    if peak is not None and math.isfinite(peak) and peak > 0 and (not now or max(now) < peak):
        return f" (peak {peak:g})"
    if now:
        return f" (currently {', '.join(f'{v:g}' for v in now)})"
    return ""


def suggested_fix(trace: Trace, ev: Evidence, cause: str, state: str, layer: str | None, step: int | None) -> str:
    """One specific sentence: what to change, where and when."""
    at = f"`{layer}`" if layer else "the first layer"
    when = f" at step {step}" if step is not None else ""
    if (cause, state) == ("learning_rate", "too_high"):
        if ev.observed.get("optimizer_restart") == "shock":
            return ("Restore the optimizer and scheduler state with the weights when resuming "
                    "(`optimizer.load_state_dict(ckpt['optimizer'])`, `scheduler.load_state_dict(ckpt['scheduler'])`, "
                    "saved with `optimizer.state_dict()` and `scheduler.state_dict()`); a fresh optimizer at the "
                    f"schedule's peak{_lr_text(trace)} throws the trained weights off their floor{when}.")
        if ev.observed.get("lr_schedule") == "jumped":
            return (f"Keep the schedule going instead of restarting it{when}: create the scheduler once (or restore "
                    "it with `scheduler.load_state_dict`) so the rate does not jump back up on trained weights; if the "
                    "restart is intended, restart at a lower peak or with a short warm-up.")
        if layer is None and step is None and retention_not_kept(ev.observed.get("retention")):
            return (f"Lower the learning rate about 10x{_lr_text(trace)} (or train fewer steps): the updates "
                    "overwrite what the model knew while the training loss still falls.")
        if ev.observed.get("warmup") == "absent":
            return (f"Add warm-up: ramp the learning rate linearly from 0 to its peak{_lr_text(trace)} over the "
                    "first 5-10% of the steps (e.g. transformers' get_linear_schedule_with_warmup); a deep "
                    "post-norm stack cannot take its peak rate from the first step.")
        if layer is None and step is None:  # no blow-up to point at: the step size alone says it
            return f"Lower the learning rate about 10x{_lr_text(trace)} or add warm-up and gradient clipping."
        return (f"Lower the learning rate about 10x{_lr_text(trace)} or add warm-up and gradient "
                f"clipping; the blow-up starts{when} in {at}.")
    if (cause, state) == ("learning_rate", "too_low"):
        if ev.observed.get("lr_schedule") == "collapsed":
            return (f"Step the scheduler once per epoch, not per batch (or give it its sizes in optimizer steps: "
                    f"step_size, T_max, milestones): the learning rate collapsed{when} to a thousandth of its "
                    f"peak{_lr_text(trace)} while the loss was still far from its floor.")
        return (f"Raise the learning rate about 10x{_lr_text(trace)} (or run a learning-rate range "
                "test); the loss barely moves.")
    if (cause, state) == ("initialization", "too_small"):
        return (f"Re-initialize {at} and the layers after it with Kaiming (ReLU) or Xavier "
                "(tanh/sigmoid) initialization at the default scale.")
    if (cause, state) == ("initialization", "too_large"):
        if ev.observed.get("saturation") == "init_softmax":
            return (f"Re-initialize the layers that feed {at} (an attention's query and key projections, or the "
                    "output head of a softmax) at the default scale, and keep the attention's 1/sqrt(head_dim) "
                    "scaling: the softmax was one-hot before the first update, so it passes almost no gradient.")
        return (f"Re-initialize {at} with Kaiming/Xavier at the default scale; the oversized "
                "weights blow up the forward pass from the first step.")
    if (cause, state) == ("data", "corrupted"):
        fault = ev.observed.get("target_fault")
        if fault == "back_to_chance":
            return ("Check the targets: the loss learned, then went back to chance level, as when labels stop "
                    "matching their inputs (shuffled, misaligned or relabelled batches); verify that the "
                    "dataset and the collate function keep every input with its own label.")
        if fault == "nonfinite_loss_first":
            return (f"Filter non-finite targets{when}: the loss turned NaN/Inf while every input and layer "
                    "output was finite (check the labels or regression targets, e.g. torch.isfinite(y).all()).")
        return (f"Drop or repair the NaN/Inf batch{when} (filter non-finite samples in the data "
                f"pipeline or apply torch.nan_to_num) before it reaches {at}.")
    if (cause, state) == ("data", "shifted"):
        return (f"Normalize inputs with fixed training-set statistics before {at}; their scale "
                f"or distribution changed{when}.")
    if cause == "training_loop":
        return _loop_fix(trace, state, at)
    if cause == "numerics":
        return _numerics_fix(trace, ev, state, when)
    if (cause, state) == ("unexplained", "not_learning"):
        return ("No modeled cause explains the stall: check that the model can express the task (a width-1 "
                "bottleneck, a wrong output size) and that the loss matches the targets (a regression loss on "
                "class ids, misaligned targets).")
    # architecture / unstable: tailor the remedy to what the structure shows
    types = {li.type for li in trace.layers}
    risk = ev.observed.get("depth_risk")
    if types & {"RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"} or trace.family == "rnn":
        return (f"Clip gradients and prefer gated cells (LSTM/GRU) or shorter unrolls for {at}; "
                "the recurrence is the unstable part.")
    if trace.family == "gnn":
        return f"Use fewer message-passing layers or add residual/normalization around {at} to stop oversmoothing."
    if risk == "deep_saturating" or ev.observed.get("saturation") not in (None, "absent"):
        return (f"Add normalization/residual connections or swap sigmoid/tanh for ReLU/GELU in the "
                f"stack starting at {at}.")
    return f"Add normalization/residual connections (or reduce depth) around {at}."




def _numerics_fix(trace: Trace, ev: Evidence, state: str, when: str) -> str:
    """The fix of a number that left its dtype: where it was born decides what to change."""
    dtype = trace.signatures.value(WEIGHTS_DTYPE) or "low-precision"
    if state == "updates_lost":
        return (f"Keep fp32 master weights: train the model in float32 under `torch.autocast(device_type, "
                f"dtype=torch.bfloat16)` (or keep an fp32 copy for the optimizer) instead of {dtype} weights; "
                "the updates are below the weights' resolution and round away, so a larger learning rate is not "
                "the fix.")
    born = ev.observed.get("data_nan")
    if born == "update":
        eps = (" `eps` rounds to 0 in float16: raise it (e.g. `eps=1e-4`) or keep fp32 weights under autocast "
               "with a `torch.amp.GradScaler`" if dtype == "float16"
               else " check the optimizer's `eps` (0 divides 0 by 0 where a gradient is exactly zero) and any "
                    "custom update rule")
        return f"The optimizer's update made the weights non-finite{when} while everything before it was finite:{eps}."
    if dtype == "float16":
        return (f"Train in float32 under `torch.autocast(device_type, dtype=torch.float16)` with a "
                f"`torch.amp.GradScaler` (or use bfloat16, whose range is fp32's): a value left float16's range"
                f"{when}.")
    return (f"Find the operation that leaves the dtype's range{when} (`torch.autograd.set_detect_anomaly(True)` "
            "names it): an exp/log/division of unbounded values, a sum that grows without a normalization; clamp "
            "or rescale it.")


def _loop_fix(trace: Trace, state: str, at: str) -> str:
    if state == "stale_gradients":
        return ("Call `optimizer.zero_grad()` once per optimizer step (before `loss.backward()`, or right after "
                "`optimizer.step()`): the gradients pile up across steps, so every update adds all past ones.")
    if state == "params_not_in_optimizer":
        n = trace.signatures.number(ORPHAN_PARAMS)
        many = f"{int(n)} parameters" if n else "parameters"
        return (f"Build the optimizer after the model is final, or add the missing parameters with "
                f"`optimizer.add_param_group(...)`: {many}, first in {at}, get gradients but are never updated.")
    if state == "graph_detached":
        return (f"Remove the `torch.no_grad()` or `.detach()` that cuts {at} from the loss: its parameters are "
                "optimized but never receive a gradient.")
    return ("Drop the final softmax: `CrossEntropyLoss` applies log-softmax itself (or keep the probabilities "
            "and use `NLLLoss` on their log); on probabilities the loss cannot go below ln(1 + (K - 1)/e).")


def unobserved_note(net: CompiledNetwork, ev: Evidence, cause: str, state: str) -> str:
    """`` Not observed: ...`` naming the unobserved variables that would bear on ``cause = state``
    (their reading would have moved it), with the reason; empty when none."""
    if cause not in net.root_cards_by_name:
        return ""
    names = []
    for var, reason in ev.gaps.items():
        m = net.root_likelihood[var]
        ok, bad = m[net.root_joint_index({})], m[net.root_joint_index({cause: state})]
        tv = 0.5 * float(abs(ok / max(ok.sum(), 1e-300) - bad / max(bad.sum(), 1e-300)).sum())
        if tv >= RELEVANT_TV:
            names.append(f"{var.replace('_', ' ')} ({reason})")
    return f" Not observed: {'; '.join(names[:3])}." if names else ""
