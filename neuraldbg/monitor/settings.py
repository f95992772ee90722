"""A monitor's arguments, validated once, as one frozen record: ``dbg.settings``.

Verification rebuilds a monitor for its replays from this record (``neuraldbg/verify/api.py``),
and add-ons read it through their context, so nothing re-lists :class:`NeuralDbg`'s arguments.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from neuraldbg.config import DetectorConfig
from neuraldbg.monitor.cadence import AUTO, DEFAULT_OVERHEAD, check_every, check_overhead  # noqa: F401 - re-exported

#: ``sync_every`` when not given: checked steps batched per host transfer (queries flush first);
#: batched on the CPU too, where reading 16 steps in a row keeps the host code's caches warm
DEFAULT_SYNC_EVERY = 16
#: ``reference_every`` when not given: a held-out forward every 10 steps
DEFAULT_REFERENCE_EVERY = 10


@dataclass(frozen=True)
class Settings:
    """Everything a :class:`~neuraldbg.NeuralDbg` was built with (``docs/api.md``).

    ``priors`` is the validated :class:`~neuraldbg.causal.priors.Priors` (``None``: the
    family's shipped priors); ``detectors`` the names of the detectors to run (``None``: all);
    ``at_init`` whether the weights on entry are an initialization (``None``: decide from the
    run, e.g. an optimizer that already holds state means a resume; a string: not at
    initialization, and why, as the framework callbacks say it of a resume); ``every`` an int
    >= 1 or ``"auto"``, ``overhead`` the budget ``"auto"`` holds; ``merge_timeout`` how
    long rank 0 waits at exit for the other ranks' traces (0: no live merge); ``resume`` the
    :class:`~neuraldbg.trace.Trace` of the run's part before the checkpoint it resumed from
    (``None``: this monitor sees the run from its start).
    """

    family: str
    optimizer: Any = None
    every: int | str = AUTO
    config: DetectorConfig = dataclasses.field(default_factory=DetectorConfig)
    detectors: tuple[str, ...] | None = None
    priors: Any = None
    sync_every: int = DEFAULT_SYNC_EVERY
    scaler: Any = None
    snapshots: bool | int | None = None
    autosave: str | None = None
    autosave_interval: float = 30.0
    reference: Callable[[Any], Any] | None = None
    reference_every: int = DEFAULT_REFERENCE_EVERY
    at_init: bool | str | None = None
    merge_timeout: float = 30.0
    resume: Any = None
    overhead: float = DEFAULT_OVERHEAD

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments that build a monitor with these settings:
        ``NeuralDbg(model, **settings.as_kwargs())``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> "Settings":
        """A copy with ``changes`` (e.g. ``snapshots=None`` for a monitor that keeps none)."""
        return dataclasses.replace(self, **changes)


def check_config(config: Any) -> DetectorConfig:
    """``config`` as a :class:`DetectorConfig` (a dict of its fields is accepted)."""
    if config is None:
        return DetectorConfig()
    if isinstance(config, dict):
        return DetectorConfig.from_dict(config)
    if not isinstance(config, DetectorConfig):
        raise TypeError(f"config must be a DetectorConfig or dict, got {type(config).__name__}")
    return config


def check_sync_every(sync_every: Any) -> int:
    """``sync_every`` as an int >= 1 (``None``: the default)."""
    if sync_every is None:
        return DEFAULT_SYNC_EVERY
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"sync_every must be an int >= 1, got {sync_every!r}")
    return sync_every


def check_scaler(scaler: Any) -> Any:
    """``scaler`` if it is a ``torch.amp.GradScaler`` (or ``None``)."""
    if scaler is not None and not (hasattr(scaler, "scale") and hasattr(scaler, "get_scale")):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    return scaler


def check_detectors(detectors: Iterable[str] | None) -> tuple[str, ...] | None:
    """``detectors`` as a tuple of names (``None``: every registered detector)."""
    if detectors is None:
        return None
    if isinstance(detectors, str):
        raise TypeError(f"detectors must be a list of detector names, got the string {detectors!r}")
    return tuple(detectors)


def check_at_init(at_init: Any) -> bool | str | None:
    """``at_init`` as ``True``, ``False``, ``None`` or a non-empty string (not at initialization,
    and why: "resumed from a checkpoint at step 500")."""
    if isinstance(at_init, str):
        if not at_init.strip():
            raise ValueError("at_init as a string says why the weights are not at initialization; got an empty one")
        return at_init.strip()
    if at_init is not None and not isinstance(at_init, bool):
        raise TypeError("at_init must be True, False, None (decide from the run) or a string saying why the weights "
                        f"are not at initialization, got {at_init!r}")
    return at_init


def not_at_init(at_init: bool | str | None) -> str | None:
    """Why the weights on entry are not an initialization, as the settings say it (``None``: they
    are, or the run decides): the coverage reason of the initialization's signatures."""
    if isinstance(at_init, str):
        return f"not at initialization: {at_init}"
    if at_init is False:
        return "not at initialization (at_init=False: resumed, loaded or pre-trained weights)"
    return None


def check_merge_timeout(timeout: Any) -> float:
    """``merge_timeout`` as a finite number of seconds >= 0 (0 turns the live merge off)."""
    import math

    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or timeout < 0:
        raise ValueError(f"merge_timeout must be a finite number of seconds >= 0 (0: no live merge at exit), "
                         f"got {timeout!r}")
    return float(timeout)


def check_resume(resume: Any, family: str) -> Any:
    """``resume`` as the :class:`~neuraldbg.trace.Trace` of the run's earlier part: a ``Trace``, a
    session document (``trace_to_dict``, what the callbacks keep in a checkpoint), a loaded
    ``Session``, or ``None``; a document may leave its ``priors`` out (``None``, as
    ``dbg.session_dict()`` does). ``TypeError`` for anything else; a broken document raises
    ``SessionFormatError`` naming the field; another family than the monitor's ``ValueError``."""
    if resume is None:
        return None
    from neuraldbg.session import Session, priors_block, trace_from_dict
    from neuraldbg.trace import Trace

    if isinstance(resume, Session):
        resume = resume.trace()
    elif isinstance(resume, dict):
        if resume.get("priors") is None:
            # dbg.session_dict() leaves the priors out (a checkpoint need not carry them): the
            # schema wants a block, and only the trace is read from it
            resume = {**resume, "priors": priors_block(None, family)}
        resume, _ = trace_from_dict(resume, source="resume")
    if not isinstance(resume, Trace):
        raise TypeError("resume must be None, a Trace, a session document (a dict: trace_to_dict, "
                        f"dbg.session_dict()) or a Session of the run's earlier part, got {type(resume).__name__}")
    if resume.family != family:
        raise ValueError(f"resume: the earlier part is of family {resume.family!r}, this monitor's is {family!r}; "
                         "pass the state of the same run (or family=...)")
    return resume
