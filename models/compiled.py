"""compiled: the MLP of ``mlp.py`` trained through ``torch.compile``.

The order matters and is the one NeuralDBG documents: the monitor is attached to the
*eager* model first (the runner builds ``NeuralDbg(trainer.model)`` before ``start()``), and
only then is the model compiled, so the hooks are traced into the compiled graph. Training
calls the compiled module; NeuralDbg, the summary and the injections see the eager one
(they share parameters). Same task, same injections, same ground truth as ``mlp``: the
findings must match eager.

Every run compiles afresh (``torch.compiler.reset()`` in ``start``; see there why). With
inductor that costs seconds (about 30 s on a cold 2-core machine, a few seconds once its
on-disk cache is warm), all of it in ``RunResult.first_step_time``; ``backend="aot_eager"``
(``config={"backend": "aot_eager"}``) keeps dynamo's tracing, which is where hooks matter,
and skips code generation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.injections import GENERAL, LABEL_FAULTS, register_general
from models.mlp import MLPConfig, MLPTrainer
from models.registry import ArchSpec, register_arch


@dataclass
class CompiledConfig(MLPConfig):
    """Hyper-parameters of the Compiled reference run (the healthy defaults)."""
    backend: str = "inductor"


class CompiledTrainer(MLPTrainer):
    """:class:`MLPTrainer` whose forward runs ``torch.compile(model)``."""

    def start(self) -> None:
        # Called after the monitor's hooks are registered on the eager module. Reset first:
        # dynamo (torch 2.13) reuses the graph compiled for an earlier instance of the same
        # class, and its guards do not look at hooks on submodules, so hooks on this run's
        # leaf modules would be silently dropped. One compile per run is the price.
        torch.compiler.reset()
        self.forward = torch.compile(self.model, backend=self.cfg.backend)


SPEC = register_arch(ArchSpec(
    name="compiled", family="mlp", config=CompiledConfig, trainer=CompiledTrainer,
    task="the mlp task, trained through torch.compile (inductor)",
    input_layer="blocks.0.fc", unstable_layer="blocks.0.fc", labels_at=1,
    notes="NeuralDbg is attached to the eager model, then the model is compiled",
))
register_general("compiled", GENERAL + LABEL_FAULTS)
