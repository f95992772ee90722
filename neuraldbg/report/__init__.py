"""Pictures of a diagnosis, read from stored results only: the HTML report and TensorBoard.

:func:`neuraldbg.report.html.write_report` (``dbg.report(path)``, ``neuraldbg report``) and
:func:`neuraldbg.report.tensorboard.to_tensorboard` (``dbg.to_tensorboard(writer)``) take a
live monitor, a loaded or merged session, or a :class:`~neuraldbg.trace.Trace`; neither
touches the model.
"""
from __future__ import annotations

from typing import Any

from neuraldbg.trace import Trace


def resolve_source(source: Any, priors: Any = None) -> tuple[Trace, Any]:
    """The trace of a monitor, session or trace, and the prior source to diagnose it with
    (``priors`` when given, else the one the monitor or session was built with)."""
    if isinstance(source, Trace):
        return source, priors
    if hasattr(source, "trace") and callable(source.trace):
        if priors is None:  # the validated priors the queries use, else the file it was given
            priors = getattr(source, "priors", None)
            if priors is None:
                priors = getattr(source, "priors_path", None)
        return source.trace(), priors
    raise TypeError(f"expected a NeuralDbg, a Session or a Trace, got {type(source).__name__}")
