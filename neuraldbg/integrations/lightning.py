"""PyTorch Lightning: ``Trainer(callbacks=[NeuralDbgCallback()])`` monitors ``trainer.fit``.

``NeuralDbgCallback(export=None, **neuraldbg_kwargs)``:

- ``on_fit_start``: a :class:`~neuraldbg.NeuralDbg` on the ``LightningModule`` with the
  trainer's optimizer (when it has exactly one; the step size is not measured otherwise);
- ``on_train_batch_start``: the monitor's step is ``trainer.global_step`` (optimizer steps, so
  the micro-batches of ``accumulate_grad_batches`` share one step);
- ``on_train_batch_end``: the loss from ``outputs`` (Lightning divides it by the accumulation
  count under automatic optimization; the callback multiplies it back);
- ``on_fit_end`` / ``on_exception``: the monitor exits, the diagnosis is logged on the
  ``neuraldbg`` logger (``callback.diagnosis``) and the session exported when ``export`` is
  ``True`` (``trainer.default_root_dir``) or a path. ``callback.dbg`` answers every query after.

The class is built on first use of the name from the Lightning packages imported by then
(``lightning.pytorch``, ``pytorch_lightning``; both when both are, so it fits either
``Trainer``); when neither is imported yet, from the first one installed.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

from neuraldbg.integrations import common

#: the import paths of Lightning's ``Callback``, preferred first
PACKAGES = ("lightning.pytorch", "pytorch_lightning")

_classes: dict[tuple, type] = {}


class _Hooks(common.CallbackBase):
    """The callback's behaviour; mixed with the Lightning ``Callback`` base(s) on first use."""

    def __init__(self, export: Any = None, **neuraldbg_kwargs: Any) -> None:
        super().__init__(export, **neuraldbg_kwargs)
        self._scale = 1

    # ---- lifecycle ---------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Enter the monitor on the module, with the trainer's optimizer."""
        if self._active:  # a fit that ended without on_fit_end: close that run first
            self._finish(trainer, None)
        opts = list(getattr(trainer, "optimizers", None) or [])
        if len(opts) > 1:
            common.log.info("neuraldbg: %d optimizers; the step size is not measured", len(opts))
        automatic = getattr(pl_module, "automatic_optimization", True)
        self._scale = int(getattr(trainer, "accumulate_grad_batches", 1) or 1) if automatic else 1
        self.diagnosis = None
        self.dbg = common.start(pl_module, common.unwrap_optimizer(opts[0]) if len(opts) == 1 else None,
                                self.neuraldbg_kwargs)
        self._active = True

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

    def _record(self, loss: Any) -> None:
        loss = loss.detach()
        self.dbg.record_loss(loss * self._scale if self._scale != 1 else loss)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Exit the monitor, log the diagnosis, export when asked."""
        self._finish(trainer, None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """The same when ``fit`` raises (the diagnosis of a crashed run is often the point)."""
        self._finish(trainer, exception)

    def _finish(self, trainer: Any, exc: BaseException | None) -> None:
        if not self._active:
            return
        self._active = False
        target = common.guarded(self._reported, "choosing the session path", common.export_target, self.export,
                                getattr(trainer, "default_root_dir", None), getattr(trainer, "global_rank", None),
                                getattr(trainer, "world_size", None))
        self.diagnosis = common.finish(self.dbg, exc, target)


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


def __getattr__(name: str) -> Any:
    if name == "NeuralDbgCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
