"""PyTorch Lightning: ``Trainer(callbacks=[NeuralDbgCallback()])`` monitors ``trainer.fit``.

``NeuralDbgCallback(export=None, verbose=True, **neuraldbg_kwargs)``:

- ``on_train_start``: a :class:`~neuraldbg.NeuralDbg` on the ``LightningModule`` with the
  trainer's optimizer when it has exactly one (with several, e.g. a GAN's, the monitor finds
  the ones stepping the module through torch's optimizer step hooks, the first to step being
  the primary).
  Lightning restores a checkpoint's weights, optimizer state and ``global_step`` after
  ``on_fit_start`` and before ``on_train_start``, so the monitor sees the run as it resumes;
  when ``fit(..., ckpt_path=...)`` resumed (``trainer.ckpt_path`` set, or ``global_step > 0``)
  it gets ``at_init="resumed from a checkpoint at step N"`` unless ``at_init`` was given: the
  restored weights are not read as an initialization. The monitor's state rides in every
  checkpoint (``state_dict``: the session document so far and the step reached, JSON-safe);
  a fit resumed from one continues it (``NeuralDbg(resume=...)``): the diagnosis, the trace
  and the export cover the whole run, and the first part's initialization stays evidence;
- ``on_train_batch_start``: the monitor's step is ``trainer.global_step`` (optimizer steps, so
  the micro-batches of ``accumulate_grad_batches`` share one step);
- ``on_train_batch_end``: the loss from ``outputs`` (Lightning divides it by the accumulation
  count under automatic optimization; the callback multiplies it back); after each statistics
  sync, ``P(healthy)`` and the hypotheses' probabilities go to every logger of the trainer
  (``logger.log_metrics``: a CSV file's columns, TensorBoard scalars under the tags of
  ``dbg.to_tensorboard``);
- ``on_fit_end`` / ``on_exception``: the monitor exits, the diagnosis is logged on the
  ``neuraldbg`` logger (``callback.diagnosis``) and the session exported when ``export`` is
  ``True`` (``trainer.log_dir``, the versioned folder of the trainer's first logger, else
  ``default_root_dir``) or a path. The final diagnosis's numbers (the tags above, with every
  state logged during the run) go to every logger at ``trainer.global_step``, then
  ``logger.save()``: the last row says what the verdict says (Lightning finalizes its loggers
  after ``on_fit_end`` and ``on_exception``). One line with the verdict is printed to stdout
  (``common.verdict_line``: "neuraldbg: no failure found (P(healthy) = 0.980)", or the top
  cause and its fix; where the session went), logging set up or not; ``verbose=False``
  prints nothing. ``callback.dbg`` answers every query after.

Every rank of a distributed job measures (and exports its own session); only global rank
zero logs and prints the diagnosis, as Lightning's ``rank_zero_only`` would.

The class is built on first use of the name from the Lightning packages imported by then
(``lightning.pytorch``, ``pytorch_lightning``; both when both are, so it fits either
``Trainer``); when neither is imported yet, from the first one installed.
"""
from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from neuraldbg.integrations import common

#: the import paths of Lightning's ``Callback``, preferred first
PACKAGES = ("lightning.pytorch", "pytorch_lightning")

_classes: dict[tuple, type] = {}


class _Hooks(common.CallbackBase):
    """The callback's behaviour; mixed with the Lightning ``Callback`` base(s) on first use."""

    def __init__(self, export: Any = None, verbose: bool = True, **neuraldbg_kwargs: Any) -> None:
        super().__init__(export, verbose, **neuraldbg_kwargs)
        self._scale = 1
        self._log_dir: str | None = None
        self._zero = True

    # ---- lifecycle ---------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """A new fit: close a run that ended without ``on_fit_end``, forget the last diagnosis."""
        if self._active:
            self._finish(trainer, None, to_loggers=False)
        self.diagnosis = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Enter the monitor on the module, with the trainer's optimizer, once a checkpoint
        being resumed is restored (after ``on_fit_start``: ``Trainer._run`` restores the
        training state between the two hooks)."""
        if self._active:  # a fit that ended without on_fit_end: close that run first
            self._finish(trainer, None, to_loggers=False)
        opts = list(getattr(trainer, "optimizers", None) or [])
        if len(opts) > 1:
            common.log.info("neuraldbg: %d optimizers; the monitor finds those that step the module", len(opts))
        automatic = getattr(pl_module, "automatic_optimization", True)
        self._scale = int(getattr(trainer, "accumulate_grad_batches", 1) or 1) if automatic else 1
        self.diagnosis = None
        self._live = common.LiveMetrics()
        self._zero = bool(getattr(trainer, "is_global_zero", True))
        # now, on every rank: trainer.log_dir is a collective (a broadcast), which a rank that
        # raised could not join at on_exception
        self._log_dir = common.guarded(self._reported, "finding the log folder", _log_dir, trainer)
        step = int(getattr(trainer, "global_step", 0) or 0)
        ckpt = getattr(trainer, "ckpt_path", None)
        kwargs = common.resumed_kwargs(self.neuraldbg_kwargs, step, ckpt)
        state, self.resume_state = self.resume_state, None  # one checkpoint, one resume
        if step or ckpt:
            kwargs = common.resumed_monitor_kwargs(kwargs, state)
        self.dbg = common.start(pl_module, common.unwrap_optimizer(opts[0]) if len(opts) == 1 else None, kwargs)
        self._active = True

    def state_dict(self) -> dict[str, Any]:
        """The monitor's state so far, saved in the checkpoint (``checkpoint["callbacks"]``):
        its session document and the step reached (``common.callback_state``); ``{}`` before
        any run."""
        state = common.guarded(self._reported, "saving the monitor state", common.callback_state, self.dbg,
                               self._step_reached())
        return state or {}

    def _step_reached(self) -> int | None:
        return None if self.dbg is None else int(self.dbg.step)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the state of the checkpoint being resumed: the next ``on_train_start`` of a
        resumed fit continues its evidence (``NeuralDbg(resume=...)``)."""
        self.resume_state = common.guarded(self._reported, "reading the monitor state", common.resume_state,
                                           state_dict)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """The step is the optimizer step about to be taken."""
        if self._active:
            common.guarded(self._reported, "setting the step", setattr, self.dbg, "step", int(trainer.global_step))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Record the micro-batch's loss (averaged over the step by the monitor)."""
        if not self._active:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None or not hasattr(loss, "detach"):
            return  # a skipped batch, or manual optimization returning no loss
        common.guarded(self._reported, "recording the loss", self._record, loss)
        common.guarded(self._reported, "logging the diagnosis to the trainer's loggers", self._log_live, trainer)

    def _record(self, loss: Any) -> None:
        loss = loss.detach()
        self.dbg.record_loss(loss * self._scale if self._scale != 1 else loss)

    def _log_live(self, trainer: Any) -> None:
        # Lightning's loggers write on rank zero only (their log_metrics is rank_zero_only)
        loggers = list(getattr(trainer, "loggers", None) or [])
        if not loggers or not self._zero:
            return
        metrics = self._live.poll(self.dbg)
        if metrics is not None:
            for logger in loggers:
                logger.log_metrics(metrics, step=self._live.step)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Exit the monitor, log the diagnosis (and its numbers to the trainer's loggers), export
        when asked, print the verdict line."""
        self._finish(trainer, None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """The same when ``fit`` raises (the diagnosis of a crashed run is often the point)."""
        self._finish(trainer, exception)

    def _finish(self, trainer: Any, exc: BaseException | None, to_loggers: bool = True) -> None:
        # to_loggers is off when a new fit closes a run left open: its loggers are not that run's
        if not self._active:
            return
        self._active = False
        folder = self._log_dir or getattr(trainer, "default_root_dir", None)
        target = common.guarded(self._reported, "choosing the session path", common.export_target, self.export,
                                folder, getattr(trainer, "global_rank", None), getattr(trainer, "world_size", None))
        self.diagnosis = common.finish(self.dbg, exc, target, announce=self._zero, live=self._live)
        if to_loggers and self.diagnosis is not None:
            common.guarded(self._reported, "logging the final diagnosis to the trainer's loggers", self._log_final,
                           trainer)
        self._tell(self._zero)

    def _log_final(self, trainer: Any) -> None:
        # pl_module.log is refused in on_fit_end: the loggers are written to directly, at the
        # step the trainer reached (after every live row), and saved, as their finalize would
        loggers = list(getattr(trainer, "loggers", None) or [])
        if not loggers or not self._zero or not self._live.metrics:
            return
        step = int(getattr(trainer, "global_step", 0) or 0)
        for logger in loggers:
            logger.log_metrics(dict(self._live.metrics), step=step)
            logger.save()


def _log_dir(trainer: Any) -> str | None:
    """``trainer.log_dir`` (the versioned folder of its first logger, else ``default_root_dir``)."""
    folder = getattr(trainer, "log_dir", None)
    return None if folder is None else str(folder)


def _bases() -> tuple[type, ...]:
    loaded = [m for m in PACKAGES if m in sys.modules]
    bases = []
    for name in loaded or PACKAGES:
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError:
            continue
        if not loaded:
            break  # nothing imported yet: the first installed package is enough
    if not bases:
        raise ImportError("NeuralDbgCallback needs Lightning: pip install lightning (or pytorch_lightning), "
                          "or pip install 'neuraldbg[lightning]'")
    return tuple(dict.fromkeys(bases))


def callback_class() -> type:
    """The ``NeuralDbgCallback`` class for the Lightning packages imported now."""
    bases = _bases()
    cls = _classes.get(bases)
    if cls is None:
        cls = _classes[bases] = common.callback_type(_Hooks, bases, __name__, __doc__)
    return cls


if TYPE_CHECKING:  # pragma: no cover - what type checkers see; at run time the class is built by __getattr__
    from lightning.pytorch import Callback as _Callback

    class NeuralDbgCallback(_Hooks, _Callback):
        """A Lightning ``Callback`` that monitors ``trainer.fit`` (see the module docstring)."""


def __getattr__(name: str) -> Any:
    if name == "NeuralDbgCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
