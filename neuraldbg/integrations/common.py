"""What every framework callback shares: starting the monitor, the diagnosis while training
runs (:class:`LiveMetrics`) and at its end, where the session goes. Nothing here imports a
framework (or torch, until a monitor starts).

A callback runs inside someone else's training loop, so after construction nothing here
raises: a monitor that cannot start, a diagnosis that cannot be computed or a session that
cannot be written is logged on the ``neuraldbg`` logger and training goes on.
"""
from __future__ import annotations

import inspect
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuraldbg.causal.types import HEALTHY_AT
from neuraldbg.report.tensorboard import p_healthy_tag, state_tag

if TYPE_CHECKING:  # pragma: no cover
    from neuraldbg.causal.types import Hypothesis

log = logging.getLogger("neuraldbg")

#: file name of the exported session when only a folder is known
SESSION_FILE = "neuraldbg_session.json"
#: NeuralDbg arguments a callback supplies itself
SUPPLIED = ("model", "optimizer")


@dataclass(frozen=True)
class Diagnosis:
    """The end-of-run diagnosis a callback logs: ``P(healthy)``, the ranked hypotheses
    (:class:`~neuraldbg.causal.types.Hypothesis`), the logged text, and the exported session
    path (``None`` when not exported)."""

    p_healthy: float
    hypotheses: tuple[Hypothesis, ...]
    text: str
    session_path: str | None = None

    @property
    def healthy(self) -> bool:
        """The library's one verdict (``docs/api.md``): ``P(healthy) >= 0.5``, as
        :attr:`neuraldbg.Posterior.is_healthy`; hypotheses may still be listed as weaker leads."""
        return self.p_healthy >= HEALTHY_AT


def check_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` if every name is a :class:`NeuralDbg` keyword a callback passes through,
    else ``TypeError`` naming the valid ones."""
    from neuraldbg.monitor.monitor import NeuralDbg

    params = [n for n in inspect.signature(NeuralDbg.__init__).parameters if n != "self"]
    valid = [n for n in params if n not in SUPPLIED]
    bad = sorted(set(kwargs) - set(valid))
    if bad:
        supplied = sorted(set(bad) & set(SUPPLIED))
        why = f" ({', '.join(supplied)}: the callback takes them from the trainer)" if supplied else ""
        raise TypeError(f"unknown NeuralDbg argument(s) {', '.join(bad)}{why}; valid: {', '.join(valid)}")
    return dict(kwargs)


def check_export(export: Any) -> Any:
    """``export`` if it is ``None``/``False`` (off), ``True`` (the trainer's folder) or a path."""
    if export is None or isinstance(export, (bool, str, os.PathLike)):
        return export
    raise TypeError(f"export must be None, True (the trainer's output folder) or a path, got {type(export).__name__}")


def check_verbose(verbose: Any) -> bool:
    """``verbose`` if it is ``True`` (print the verdict line when the run ends) or ``False``."""
    if isinstance(verbose, bool):
        return verbose
    raise TypeError("verbose must be True (print one line with the verdict when the run ends) or False (print "
                    f"nothing; the diagnosis is still logged), got {type(verbose).__name__}")


def resumed_kwargs(kwargs: dict[str, Any], step: int | None, checkpoint: Any = None) -> dict[str, Any]:
    """``kwargs`` with ``at_init`` saying the run resumed from a checkpoint at ``step`` (the
    restored weights are no initialization, ``neuraldbg/monitor/measurements/weights.py``),
    when ``step`` or ``checkpoint`` tells of a resume and the user did not pass ``at_init``."""
    if "at_init" in kwargs or (not step and not checkpoint):
        return kwargs
    where = f" ({checkpoint})" if checkpoint else ""
    log.info("neuraldbg: resumed from a checkpoint at step %s%s; the weights' scale is not read as an "
             "initialization", step, where)
    return {**kwargs, "at_init": f"resumed from a checkpoint at step {step}{where}"}


#: version of the state a callback keeps in a checkpoint (:func:`callback_state`)
STATE_VERSION = 1


def callback_state(dbg: Any, step: int | None) -> dict[str, Any]:
    """What a callback keeps in a checkpoint: ``{"version", "step", "started_at_init",
    "session"}``, where ``session`` is the monitor's session document so far
    (``dbg.session_dict()``: JSON-safe, no tensors, no priors) and ``started_at_init`` whether
    the run's first part started at an initialization (its entry is the run's). Empty when no
    monitor ran yet."""
    if dbg is None:
        return {}
    from neuraldbg.causal.nodes.run import STARTED_TRAINED

    doc = dbg.session_dict()
    return {"version": STATE_VERSION, "step": step, "started_at_init": STARTED_TRAINED.name not in doc["signatures"],
            "session": doc}


def resume_state(state: Any) -> dict[str, Any] | None:
    """``state`` (from a checkpoint) when it is a callback state this version reads, else ``None``
    with a warning saying why: a checkpoint of another version must not stop the fit."""
    if not state:
        return None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION \
            or not isinstance(state.get("session"), dict):
        got = state.get("version") if isinstance(state, dict) else type(state).__name__
        log.warning("neuraldbg: the callback state in the checkpoint is not one this version reads (version %r, "
                    "valid: %d); the resumed run is diagnosed from the resume on", got, STATE_VERSION)
        return None
    return state


def resumed_monitor_kwargs(kwargs: dict[str, Any], state: dict[str, Any] | None) -> dict[str, Any]:
    """``kwargs`` with ``resume=`` the earlier part's session when a checkpoint carried one (and
    the user passed no ``resume``)."""
    if state is None or "resume" in kwargs:
        return kwargs
    return {**kwargs, "resume": state["session"]}


def start(model: Any, optimizer: Any, kwargs: dict[str, Any]) -> Any:
    """A :class:`NeuralDbg` on ``model``, entered. Bad arguments raise (before training starts)."""
    from neuraldbg.monitor.monitor import NeuralDbg

    if "resume" in kwargs:
        try:
            dbg = NeuralDbg(model, optimizer=optimizer, **kwargs)
        except (TypeError, ValueError) as e:  # a checkpoint's state that does not fit: this part alone
            log.warning("neuraldbg: the checkpoint's monitor state cannot be continued (%s); the resumed run is "
                        "diagnosed from the resume on", e)
            dbg = NeuralDbg(model, optimizer=optimizer, **{k: v for k, v in kwargs.items() if k != "resume"})
    else:
        dbg = NeuralDbg(model, optimizer=optimizer, **kwargs)
    dbg.__enter__()
    return dbg


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a wrapper (accelerate's ``AcceleratedOptimizer`` and the like
    step their ``.optimizer``, whose step hooks are the ones that fire)."""
    seen = 0
    while optimizer is not None and hasattr(optimizer, "optimizer") and seen < 4 \
            and hasattr(optimizer.optimizer, "param_groups"):
        optimizer, seen = optimizer.optimizer, seen + 1
    return optimizer


def export_target(export: Any, default_dir: str | os.PathLike | None, rank: int | None,
                  world_size: int | None) -> Path | None:
    """Where the session goes: ``None`` when off; ``True`` means ``default_dir``; an existing
    folder gets :data:`SESSION_FILE` inside; each rank of a distributed job its own file."""
    if export is None or export is False:
        return None
    if export is True:
        if default_dir is None:
            log.warning("neuraldbg: export=True but the trainer names no output folder; using the current one")
        p = Path(default_dir or ".") / SESSION_FILE
    else:
        p = Path(export)
        if p.is_dir():
            p = p / SESSION_FILE
    if world_size is not None and world_size > 1 and rank is not None:
        p = p.with_name(f"{p.stem}.rank{rank}{p.suffix}")
    return p


def describe(p_healthy: float, hypotheses: list, top: int = 3) -> str:
    """The diagnosis as a few log lines: the verdict (healthy when ``P(healthy) >= 0.5``), then
    the top hypotheses with their fixes."""
    healthy = p_healthy >= HEALTHY_AT
    if healthy and not hypotheses:
        return f"no failure found (P(healthy) = {p_healthy:.3f})"
    if healthy:
        lines = [f"no failure found (P(healthy) = {p_healthy:.3f}); weaker leads:"]
    elif not hypotheses:
        return (f"something is off (P(healthy) = {p_healthy:.3f} < {HEALTHY_AT:g}) but no single cause "
                "reaches the reporting floor")
    else:
        lines = [f"diagnosis (P(healthy) = {p_healthy:.3f}):"]
    for i, h in enumerate(hypotheses[:top], 1):
        lines.append(f"  {i}. {h.description}\n     fix: {h.suggested_fix}")
    return "\n".join(lines)


def finish(dbg: Any, exc: BaseException | None, target: Path | None, announce: bool = True,
           live: LiveMetrics | None = None) -> Diagnosis | None:
    """Exit the monitor, log the diagnosis (a warning when the run is not healthy, info when it
    is; at debug level when ``announce`` is false, on the ranks of a distributed job other
    than zero) and export the session to ``target``; ``None`` when the diagnosis failed.
    ``live``, when given, is settled on the final posterior (:meth:`LiveMetrics.settle`)."""
    if dbg is None:
        return None
    try:
        dbg.__exit__(type(exc) if exc is not None else None, exc, getattr(exc, "__traceback__", None))
    except Exception:  # noqa: BLE001 - the monitor's own exit is guarded; be safe around a framework
        log.exception("neuraldbg: could not close the monitor")
    path = None
    if target is not None:
        try:
            path = dbg.export_aquarium_package(target)
        except Exception as e:  # noqa: BLE001 - a full disk must not turn a finished run into a crash
            log.error("neuraldbg: could not write the session to %s: %r", target, e)
    try:
        post = dbg.posterior()
        hyps = dbg.get_causal_hypotheses()
    except Exception:  # noqa: BLE001
        log.exception("neuraldbg: the diagnosis could not be computed")
        return None
    text = describe(post.p_healthy, hyps)
    if path is not None:
        text += f"\n  session written to {path}"
    level = (logging.INFO if post.is_healthy else logging.WARNING) if announce else logging.DEBUG
    log.log(level, "neuraldbg: %s", text)
    if live is not None:
        try:
            live.settle(post)
        except Exception:  # noqa: BLE001 - the verdict stands without the numbers for the loggers
            log.exception("neuraldbg: the final numbers for the trainer's loggers could not be computed")
    return Diagnosis(p_healthy=post.p_healthy, hypotheses=tuple(hyps), text=text, session_path=path)


def verdict_line(d: Diagnosis) -> str:
    """The diagnosis in one line (what a callback prints when the run ends): the verdict as
    :func:`describe` words it, the top hypothesis with its fix when the run is not healthy (the
    weaker lead when it is), and where the session went."""
    if d.healthy:
        line = describe(d.p_healthy, [])
        if d.hypotheses:
            line += f"; weaker lead: {_flat(d.hypotheses[0].description)}"
    elif d.hypotheses:
        top = d.hypotheses[0]
        line = f"{_flat(top.description)}; fix: {_flat(top.suggested_fix)}"
    else:
        line = describe(d.p_healthy, [])
    if d.session_path is not None:
        line += f"; session at {d.session_path}"
    return line


def _flat(sentence: str) -> str:
    # the line ends a sentence with the next clause's "; ", and never breaks
    return " ".join(sentence.split()).rstrip(".")


def say(line: str) -> None:
    """Print ``line`` to stdout, flushed: a notebook and a terminal both show it, with or
    without logging set up."""
    print(line, file=sys.stdout, flush=True)


class LiveMetrics:
    """The diagnosis while training runs, once per statistics sync of a monitor.

    :meth:`poll` is cheap when nothing new reached the host (one attribute read) and never
    forces a transfer: the posterior is computed from ``dbg.trace(flush=False)`` when
    ``dbg.synced_step`` has moved. The numbers, under the tags of ``dbg.to_tensorboard``:
    ``{prefix}/p_healthy`` and ``{prefix}/hypothesis/{cause}={state}`` for every abnormal state
    that has reached the reporting floor at some sync so far (kept from then on, so a chart or
    a CSV column does not come and go).
    """

    def __init__(self, prefix: str = "neuraldbg") -> None:
        self.prefix = prefix
        self.step: int | None = None
        self.metrics: dict[str, float] = {}
        self._states: list[tuple[str, str]] = []

    def poll(self, dbg: Any) -> dict[str, float] | None:
        """The new numbers when a sync happened since the last call, else ``None``."""
        step = dbg.synced_step
        if step is None or step == self.step:
            return None
        from neuraldbg.causal import api

        self.step = step
        return self._take(api.posterior(dbg.trace(flush=False), dbg.priors))

    def settle(self, post: Any) -> dict[str, float]:
        """The numbers of the run's final posterior ``post`` (the verdict's), under the same tags
        and with every state seen at a sync: a framework's last row then says what the verdict
        says. :attr:`step` stays the last sync's."""
        return self._take(post)

    def _take(self, post: Any) -> dict[str, float]:
        from neuraldbg.causal.hypotheses import REPORT_FLOOR

        for var, state, p in post.abnormal():
            if p >= REPORT_FLOOR and (var, state) not in self._states:
                self._states.append((var, state))
        self.metrics = {p_healthy_tag(self.prefix): post.p_healthy}
        self.metrics.update({state_tag(self.prefix, v, s): post[v][s] for v, s in self._states})
        return dict(self.metrics)


def guarded(reported: set, what: str, fn, *args) -> Any:
    """``fn(*args)``, logging a failure once per ``what`` (kept in ``reported``) instead of
    raising it: a callback never stops training."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        if what not in reported:
            reported.add(what)
            log.warning("neuraldbg: %s failed: %r", what, e)
        return None


class CallbackBase:
    """What both framework callbacks hold: the checked ``NeuralDbg`` arguments, export target
    and ``verbose`` switch, the last run's monitor (queries work after the run too) and its
    diagnosis."""

    def __init__(self, export: Any = None, verbose: bool = True, **neuraldbg_kwargs: Any) -> None:
        super().__init__()
        self.neuraldbg_kwargs = check_kwargs(neuraldbg_kwargs)
        self.export = check_export(export)
        self.verbose = check_verbose(verbose)
        self.dbg: Any = None
        self.diagnosis: Diagnosis | None = None
        self._active = False
        self._reported: set = set()
        self._live = LiveMetrics()
        #: the monitor state read from the checkpoint being resumed (consumed by the next start)
        self.resume_state: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"NeuralDbgCallback(export={self.export!r}, verbose={self.verbose!r}, **{self.neuraldbg_kwargs!r})"

    def _tell(self, zero: bool) -> None:
        """Print the verdict line, on rank zero only and unless ``verbose=False``."""
        if self.verbose and zero and self.diagnosis is not None:
            guarded(self._reported, "printing the verdict", self._write, f"neuraldbg: {verdict_line(self.diagnosis)}")

    def _write(self, line: str) -> None:
        say(line)


def callback_type(hooks: type, bases: tuple[type, ...], module: str, doc: str | None) -> type:
    """``NeuralDbgCallback``: the framework-independent ``hooks`` mixed with the framework's
    callback ``bases`` (built on first use, so importing an integration loads no framework)."""
    return type("NeuralDbgCallback", (hooks, *bases), {"__module__": module, "__doc__": doc,
                                                       "__qualname__": "NeuralDbgCallback"})
