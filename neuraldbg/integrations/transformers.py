"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[NeuralDbgCallback()])``.

``NeuralDbgCallback(export=None, verbose=True, **neuraldbg_kwargs)`` is a ``transformers.TrainerCallback``:

- ``on_train_begin``: a :class:`~neuraldbg.NeuralDbg` on the ``model`` the trainer passes,
  with its ``optimizer`` (accelerate's wrapper looked through). ``train(resume_from_checkpoint=...)``
  has restored the weights, the optimizer state and ``state.global_step`` by then: a run that
  starts at ``global_step > 0`` gets ``at_init="resumed from a checkpoint at step N"`` unless
  ``at_init`` was given, so the restored weights are not read as an initialization. The
  monitor's state rides in each checkpoint's ``trainer_state.json`` (``stateful_callbacks``:
  the callback is a ``transformers.ExportableState``); a resumed ``train`` continues it
  (``NeuralDbg(resume=...)``), so the diagnosis, the trace and the export cover the whole run
  and the first part's initialization stays evidence. The callback reads that state itself,
  so ``restore_callback_states_from_checkpoint`` need not be on (when it is, the Trainer
  replaces the callback passed by one built from its JSON-safe arguments);
- ``on_step_begin``: the monitor's step is ``state.global_step``, so the
  ``gradient_accumulation_steps`` micro-batches of one optimizer step share one step;
- the loss: each training forward's ``outputs.loss`` (what ``Trainer.compute_loss`` reads),
  taken by a forward hook on the model and averaged over the step by the monitor; when the
  model returns no ``loss`` (a custom ``compute_loss``), the ``loss`` of ``on_log`` instead,
  at the logging steps only;
- ``on_log``: ``P(healthy)`` and the hypotheses' probabilities as of the last statistics sync
  join ``logs`` (and the entry of ``state.log_history`` the Trainer made of them), so every
  ``report_to`` integration receives them; the callback moves itself to the front of the
  Trainer's callbacks so that it runs before those integrations;
- after each statistics sync, when the Trainer has a TensorBoard writer (``report_to``
  ``tensorboard``), the same numbers go to it under the tags of ``dbg.to_tensorboard``;
- ``on_train_end``: the monitor exits, the diagnosis is logged on the ``neuraldbg`` logger
  (``callback.diagnosis``) and, when ``export`` is ``True`` (``args.output_dir``, next to the
  checkpoints) or a path, the session is written there. The final diagnosis's numbers (the
  tags above, with every state logged during the run) are logged as ``Trainer.log`` does: an
  entry ``{..., "step": state.global_step}`` appended to ``state.log_history`` and handed to
  every callback's ``on_log`` (the ``report_to`` integrations, before their own
  ``on_train_end`` closes them): the last entry with ``neuraldbg/p_healthy`` says what the
  verdict says (the train summary the Trainer logs just before holds the last sync's); the
  TensorBoard writer gets them too, at ``state.global_step``. Then
  one line with the verdict is printed to stdout (through the Trainer's progress bar when it
  has one; ``common.verdict_line``), logging set up or not; ``verbose=False`` prints nothing.

Every process of a distributed job measures (and exports its own session); only the world's
process zero (``state.is_world_process_zero``) logs and prints the diagnosis.

The Trainer has no exception hook: when ``trainer.train()`` may raise, use the callback as a
context manager (``with callback: trainer.train()``) or call ``callback.close()``, so the
hooks come off and the crashed run is diagnosed too (and its verdict printed; the Trainer's
logs get no final entry then, no hook being left to log through).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from neuraldbg.integrations import common

_classes: dict[str, type] = {}
#: frames searched upwards from a hook for the Trainer's ``CallbackHandler``
_HANDLER_DEPTH = 4


class _Hooks(common.CallbackBase):
    """The callback's behaviour, mixed with ``transformers.TrainerCallback`` on first use."""

    def __init__(self, export: Any = None, verbose: bool = True, **neuraldbg_kwargs: Any) -> None:
        super().__init__(export, verbose, **neuraldbg_kwargs)
        self._handle: Any = None
        self._saw_loss = False
        self._output_dir: str | None = None
        self._zero = True
        self._handler: Any = None

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
        self._zero = bool(getattr(state, "is_world_process_zero", True))
        self._live = common.LiveMetrics()
        self._handler = common.guarded(self._reported, "finding the Trainer's callbacks", self._go_first)
        step = int(getattr(state, "global_step", 0) or 0)
        kwargs = common.resumed_kwargs(self.neuraldbg_kwargs, step)
        saved, self.resume_state = self.resume_state, None  # one checkpoint, one resume
        if step:
            if saved is None:  # the Trainer restores stateful callbacks only when asked: read it here
                saved = common.guarded(self._reported, "reading the monitor state", _saved_state, state)
            kwargs = common.resumed_monitor_kwargs(kwargs, common.resume_state(saved))
            common.guarded(self._reported, "making room for the monitor state", _make_room, state)
        self.dbg = common.start(model, common.unwrap_optimizer(optimizer), kwargs)
        self._active = True
        self._handle = common.guarded(self._reported, "hooking the loss", model.register_forward_hook, self._forward)

    def _go_first(self) -> Any:
        """Move this callback to the front of the Trainer's ``CallbackHandler`` and return it.

        The Trainer puts the ``report_to`` integrations before the user's callbacks and calls
        ``on_log`` on each in turn with one ``logs`` dict: only a callback that runs first can
        add to what they all receive. The handler is no argument of the hooks, so it is found
        as the ``self`` of the frame that called this hook (``CallbackHandler.call_event``).
        """
        frame = sys._getframe(1)
        for _ in range(_HANDLER_DEPTH):
            frame = frame.f_back
            if frame is None:
                break
            handler = frame.f_locals.get("self")
            callbacks = getattr(handler, "callbacks", None)
            if isinstance(callbacks, list) and any(cb is self for cb in callbacks):
                callbacks[:] = [self] + [cb for cb in callbacks if cb is not self]
                return handler
        common.log.info("neuraldbg: the Trainer's callback list was not found; report_to integrations that "
                        "run before this callback do not receive the diagnosis in their logs")
        return None

    def state(self) -> dict[str, Any]:
        """``transformers.ExportableState``: what ``trainer_state.json`` keeps under
        ``stateful_callbacks["NeuralDbgCallback"]`` at each checkpoint. ``attributes.resume_state``
        is the monitor's state so far (``common.callback_state``: its session document, the step
        reached); ``args`` the constructor's arguments that JSON holds (a ``priors`` object or a
        ``reference`` function is left out: the Trainer rebuilds the callback from ``args`` when
        ``restore_callback_states_from_checkpoint`` is on)."""
        saved = common.guarded(self._reported, "saving the monitor state", common.callback_state, self.dbg,
                               None if self.dbg is None else int(self.dbg.step))
        return {"args": _json_args(self.export, {"verbose": self.verbose, **self.neuraldbg_kwargs}),
                "attributes": {"resume_state": saved or None}}

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The step is the optimizer step about to be taken (closing the last may sync)."""
        if self._active:
            common.guarded(self._reported, "setting the step", setattr, self.dbg, "step", int(state.global_step))
            common.guarded(self._reported, "writing the diagnosis to TensorBoard", self._live_to_tensorboard)

    def _live_to_tensorboard(self) -> None:
        if not self._zero:
            return
        metrics = self._live.poll(self.dbg)
        writer = self._tensorboard_writer()
        if metrics is not None and writer is not None:
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, self._live.step)

    def _tensorboard_writer(self) -> Any:
        """The ``SummaryWriter`` of the Trainer's ``TensorBoardCallback`` (created in its own
        ``on_train_begin``, so looked up when needed), or ``None``."""
        for cb in getattr(self._handler, "callbacks", None) or ():
            writer = getattr(cb, "tb_writer", None)
            if writer is not None and hasattr(writer, "add_scalar"):
                return writer
        return None

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
        """Add the diagnosis as of the last sync to ``logs`` (and to the ``log_history`` entry
        made of them); for models that return no ``loss``, record the logged one."""
        if not self._active:
            return
        if not self._saw_loss and isinstance(logs, Mapping) and isinstance(logs.get("loss"), (int, float)):
            common.guarded(self._reported, "recording the logged loss", self.dbg.record_loss, float(logs["loss"]))
        if isinstance(logs, dict):
            common.guarded(self._reported, "adding the diagnosis to the logs", self._add_to_logs, state, logs)

    def _add_to_logs(self, state: Any, logs: dict) -> None:
        self._live.poll(self.dbg)
        if not self._live.metrics:
            return
        history = getattr(state, "log_history", None)
        # Trainer.log appended {**logs, "step": ...} to log_history before calling on_log
        last = history[-1] if history else None
        mine = isinstance(last, dict) and last.get("step") == state.global_step \
            and all(last.get(k) == v for k, v in logs.items())
        logs.update(self._live.metrics)
        if mine:
            last.update(self._live.metrics)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Exit the monitor, log the diagnosis (and its numbers to the Trainer's logs), write the
        session when asked, print the verdict line."""
        self._close(None, (args, state, control))

    def close(self, exc: BaseException | None = None) -> common.Diagnosis | None:
        """End the run now (idempotent): hooks off, diagnosis logged, session written, verdict printed."""
        return self._close(exc, None)

    def _close(self, exc: BaseException | None, end: tuple[Any, Any, Any] | None) -> common.Diagnosis | None:
        # end: on_train_end's (args, state, control), what logging through the Trainer takes
        if not self._active:
            return self.diagnosis
        self._active = False
        if self._handle is not None:
            common.guarded(self._reported, "unhooking the loss", self._handle.remove)
            self._handle = None
        target = common.guarded(self._reported, "choosing the session path", common.export_target, self.export,
                                self._output_dir, self.dbg.rank, self.dbg.world_size)
        self.diagnosis = common.finish(self.dbg, exc, target, announce=self._zero, live=self._live)
        if end is not None and self.diagnosis is not None:
            common.guarded(self._reported, "logging the final diagnosis", self._log_final, *end)
        self._tell(self._zero)
        self._handler = None
        return self.diagnosis

    def _log_final(self, args: Any, state: Any, control: Any) -> None:
        """What ``Trainer.log`` does (the Trainer is no argument of the hooks), with the final
        numbers: the ``log_history`` entry, then every callback's ``on_log``; and the same
        numbers to the TensorBoard writer, where the live ones went."""
        logs = dict(self._live.metrics)
        if not logs:
            return
        history = getattr(state, "log_history", None)
        if isinstance(history, list):
            history.append({**logs, "step": state.global_step})
        writer = self._tensorboard_writer() if self._zero else None
        if writer is not None:
            for tag, value in logs.items():
                writer.add_scalar(tag, value, state.global_step)
        if self._handler is not None:
            self._handler.on_log(args, state, control, logs)

    def _write(self, line: str) -> None:
        """Print ``line`` above the Trainer's progress bar when one is open (its own
        ``on_train_end`` closes it after this callback's), else to stdout."""
        for cb in getattr(self._handler, "callbacks", None) or ():
            bar = getattr(cb, "training_bar", None)
            if bar is not None and hasattr(bar, "write"):
                bar.write(line, file=sys.stdout)
                sys.stdout.flush()
                return
        common.say(line)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.close(exc)
        return False


def _saved_state(state: Any) -> Any:
    """The callback's state in the checkpoint the Trainer resumed from (``state.stateful_callbacks``
    as ``trainer_state.json`` holds it), or ``None``."""
    saved = (getattr(state, "stateful_callbacks", None) or {}).get("NeuralDbgCallback")
    if isinstance(saved, list):  # several callbacks of one class: the first is this one
        saved = saved[0] if saved else None
    return (saved.get("attributes") or {}).get("resume_state") if isinstance(saved, dict) else None


def _make_room(state: Any) -> None:
    """An entry for this callback in ``state.stateful_callbacks`` when the checkpoint resumed has
    none (it was saved without the callback): ``Trainer._save_checkpoint`` updates the entry of
    each stateful callback by its class name and raises ``KeyError`` on a missing one."""
    saved = getattr(state, "stateful_callbacks", None)
    if isinstance(saved, dict) and "NeuralDbgCallback" not in saved:
        saved["NeuralDbgCallback"] = {"args": {}, "attributes": {}}


def _json_args(export: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments JSON holds (``trainer_state.json`` is JSON)."""
    import json

    args: dict[str, Any] = {}
    for name, value in {"export": str(export) if isinstance(export, os.PathLike) else export, **kwargs}.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        args[name] = value
    return args


def callback_class() -> type:
    """The ``NeuralDbgCallback`` class (a ``transformers.TrainerCallback`` and, where transformers
    has it, an ``ExportableState``: its state rides in the checkpoints)."""
    cls = _classes.get("cls")
    if cls is None:
        try:
            from transformers import TrainerCallback
        except ImportError as e:
            raise ImportError("NeuralDbgCallback needs transformers: pip install transformers accelerate") from e
        try:
            from transformers.trainer_callback import ExportableState
            bases: tuple[type, ...] = (TrainerCallback, ExportableState)
        except ImportError:  # transformers before 4.41: no stateful callbacks
            bases = (TrainerCallback,)
        cls = _classes["cls"] = common.callback_type(_Hooks, bases, __name__, __doc__)
    return cls


if TYPE_CHECKING:  # pragma: no cover - what type checkers see; at run time the class is built by __getattr__
    from transformers import TrainerCallback as _TrainerCallback

    class NeuralDbgCallback(_Hooks, _TrainerCallback):
        """A ``transformers.TrainerCallback`` that monitors ``trainer.train()`` (see the module docstring)."""


def __getattr__(name: str) -> Any:
    if name == "NeuralDbgCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
