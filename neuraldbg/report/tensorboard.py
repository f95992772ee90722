"""The diagnosis in TensorBoard: ``dbg.to_tensorboard(writer)``.

Writes, for each checked step of a stored trace, ``P(healthy)`` and the probability of the
final diagnosis' top hypotheses as scalars (the posterior as of that step, see
:mod:`neuraldbg.report.timeline`), and the diagnosis as text at the last step. ``writer`` is
any object with TensorBoard's ``add_scalar(tag, value, global_step)`` and
``add_text(tag, text, global_step)`` (``torch.utils.tensorboard.SummaryWriter``,
``tensorboardX``); this module imports neither.
"""
from __future__ import annotations

from typing import Any

from neuraldbg.report import resolve_source
from neuraldbg.report.timeline import MAX_POINTS, posterior_timeline
from neuraldbg.trace import Trace


def p_healthy_tag(prefix: str = "neuraldbg") -> str:
    """The scalar tag of ``P(healthy)`` (also the key the framework callbacks log it under)."""
    return f"{prefix}/p_healthy"


def state_tag(prefix: str, cause: str, state: str) -> str:
    """The scalar tag of ``P(cause = state)``."""
    return f"{prefix}/hypothesis/{cause}={state}"


def diagnosis_markdown(trace: Trace, priors: Any = None, top: int = 3) -> str:
    """The diagnosis as Markdown (TensorBoard's text plugin renders it)."""
    from neuraldbg.causal import api

    post = api.posterior(trace, priors)
    hyps = api.hypotheses(trace, priors)
    lines = [f"**P(healthy) = {post.p_healthy:.3f}** ({len(trace.events)} events, steps "
             f"{trace.first_step}-{trace.last_step}, family {trace.family})", ""]
    if post.is_healthy:
        lines.append("No failure found: the run is healthy (P(healthy) >= 0.5)."
                     + (" Weaker leads:" if hyps else ""))
    elif not hyps:
        lines.append("Something is off (P(healthy) < 0.5), but no single cause reaches the reporting floor.")
    for i, h in enumerate(hyps[:top], 1):
        lines += [f"{i}. {h.description}", f"   *fix:* {h.suggested_fix}"]
    return "\n".join(lines)


def to_tensorboard(source: Any, writer: Any, *, priors: Any = None, top: int = 3, prefix: str = "neuraldbg",
                   max_points: int = MAX_POINTS) -> list[int]:
    """Write the posterior per checked step and the diagnosis to ``writer``; returns the steps.

    ``source`` is a live monitor, a loaded session or a :class:`Trace`. Tags:
    ``{prefix}/p_healthy``, ``{prefix}/hypothesis/{cause}={state}`` (the ``top`` hypotheses of
    the final diagnosis, or the most probable abnormal states when none is reported) and the
    text ``{prefix}/diagnosis``.
    """
    if not (hasattr(writer, "add_scalar") and hasattr(writer, "add_text")):
        raise TypeError(f"writer must have add_scalar and add_text (a TensorBoard SummaryWriter), "
                        f"got {type(writer).__name__}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"top must be an int >= 0, got {top!r}")
    trace, priors = resolve_source(source, priors)
    from neuraldbg.causal import api

    pri = api.resolve_priors(trace, priors)
    final = api.posterior(trace, pri)
    chosen = [(h.cause, h.state) for h in api.hypotheses(trace, pri)][:top]
    if not chosen:
        chosen = [(v, s) for v, s, _ in final.abnormal()[:top]]
    points = posterior_timeline(trace, pri, max_points=max_points)
    for pt in points:
        writer.add_scalar(p_healthy_tag(prefix), pt.p_healthy, pt.step)
        for cause, state in chosen:
            writer.add_scalar(state_tag(prefix, cause, state), pt.probability(cause, state), pt.step)
    writer.add_text(f"{prefix}/diagnosis", diagnosis_markdown(trace, pri, top=max(top, 1)), trace.last_step)
    if hasattr(writer, "flush"):
        writer.flush()
    return [pt.step for pt in points]
