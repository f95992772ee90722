"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[NeuralDbgCallback()])``.

``NeuralDbgCallback(export=None, **neuraldbg_kwargs)`` is a ``transformers.TrainerCallback``:

- ``on_train_begin``: a :class:`~neuraldbg.NeuralDbg` on the ``model`` the trainer passes,
  with its ``optimizer`` (accelerate's wrapper looked through);
- ``on_step_begin``: the monitor's step is ``state.global_step``, so the
  ``gradient_accumulation_steps`` micro-batches of one optimizer step share one step;
- the loss: each training forward's ``outputs.loss`` (what ``Trainer.compute_loss`` reads),
  taken by a forward hook on the model and averaged over the step by the monitor; when the
  model returns no ``loss`` (a custom ``compute_loss``), the ``loss`` of ``on_log`` instead,
  at the logging steps only;
- ``on_train_end``: the monitor exits, the diagnosis is logged on the ``neuraldbg`` logger
  (``callback.diagnosis``) and, when ``export`` is ``True`` (``args.output_dir``, next to the
  checkpoints) or a path, the session is written there.

The Trainer has no exception hook: when ``trainer.train()`` may raise, use the callback as a
context manager (``with callback: trainer.train()``) or call ``callback.close()``, so the
hooks come off and the crashed run is diagnosed too.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neuraldbg.integrations import common

_classes: dict[str, type] = {}


class _Hooks(common.CallbackBase):
    """The callback's behaviour, mixed with ``transformers.TrainerCallback`` on first use."""

    def __init__(self, export: Any = None, **neuraldbg_kwargs: Any) -> None:
        super().__init__(export, **neuraldbg_kwargs)
        self._handle: Any = None
        self._saw_loss = False
        self._output_dir: str | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        """Enter the monitor on the model, with the trainer's optimizer."""
        if self._active:  # the previous train() raised without close()
            self.close()
        if model is None:
            raise ValueError("NeuralDbgCallback: the Trainer passed no model to on_train_begin")
        self.diagnosis = None
        self._saw_loss = False
        self._output_dir = getattr(args, "output_dir", None)
        self.dbg = common.start(model, common.unwrap_optimizer(optimizer), self.neuraldbg_kwargs)
        self._active = True
        self._handle = common.guarded(self._reported, "hooking the loss", model.register_forward_hook, self._forward)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The step is the optimizer step about to be taken."""
        if self._active:
            common.guarded(self._reported, "setting the step", setattr, self.dbg, "step", int(state.global_step))

    def _forward(self, module: Any, inputs: Any, output: Any) -> None:
        # evaluation runs in eval mode under no_grad: only training forwards carry the loss
        if not (self._active and module.training):
            return
        import torch

        if not torch.is_grad_enabled():
            return
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._saw_loss = True
            common.guarded(self._reported, "recording the loss", self.dbg.record_loss, loss.detach().reshape(()))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Fallback loss source for models that return no ``loss``: the logged one."""
        if self._active and not self._saw_loss and isinstance(logs, Mapping) \
                and isinstance(logs.get("loss"), (int, float)):
            common.guarded(self._reported, "recording the logged loss", self.dbg.record_loss, float(logs["loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Exit the monitor, log the diagnosis, write the session when asked."""
        self.close()

    def close(self, exc: BaseException | None = None) -> common.Diagnosis | None:
        """End the run now (idempotent): hooks off, diagnosis logged, session written."""
        if not self._active:
            return self.diagnosis
        self._active = False
        if self._handle is not None:
            common.guarded(self._reported, "unhooking the loss", self._handle.remove)
            self._handle = None
        target = common.guarded(self._reported, "choosing the session path", common.export_target, self.export,
                                self._output_dir, self.dbg.rank, self.dbg.world_size)
        self.diagnosis = common.finish(self.dbg, exc, target)
        return self.diagnosis

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.close(exc)
        return False


def callback_class() -> type:
    """The ``NeuralDbgCallback`` class (a ``transformers.TrainerCallback``)."""
    cls = _classes.get("cls")
    if cls is None:
        try:
            from transformers import TrainerCallback
        except ImportError as e:
            raise ImportError("NeuralDbgCallback needs transformers: pip install transformers accelerate") from e
        cls = _classes["cls"] = common.callback_type(_Hooks, (TrainerCallback,), __name__, __doc__)
    return cls


def __getattr__(name: str) -> Any:
    if name == "NeuralDbgCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
