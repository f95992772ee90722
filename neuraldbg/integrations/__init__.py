"""Callbacks for the training frameworks people already use (``docs/api.md``, "Integrations").

- :mod:`neuraldbg.integrations.lightning`: ``NeuralDbgCallback``, a Lightning ``Callback``
  (``lightning`` or ``pytorch_lightning``);
- :mod:`neuraldbg.integrations.transformers`: ``NeuralDbgCallback``, a Hugging Face
  ``TrainerCallback``.

Importing this package, or either module, loads no framework: each builds its callback class
on first use of the name, from the framework installed (and already imported) at that time.
TensorBoard output lives with the other pictures, in :mod:`neuraldbg.report.tensorboard`.
"""
