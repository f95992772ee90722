"""dataparallel: the MLP of ``mlp.py`` wrapped in ``nn.DataParallel``.

``device="auto"``: on a machine with GPUs the model lives on ``cuda:0`` and DataParallel
splits each batch over every visible GPU (replicating the module, and its hooks, per
step); on a CPU-only machine DataParallel falls back to calling the module directly, so
the run is the mlp run through one more wrapper. NeuralDbg is given the wrapper, as a user
would, and reports layers under the inner module's names (``blocks.0.fc``), which are the
ground-truth layer names here. Same injections and truths as ``mlp``.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from models.injections import GENERAL, LABEL_FAULTS, register_general
from models.mlp import MLPConfig, MLPTrainer
from models.registry import ArchSpec, register_arch


@dataclass
class DataParallelConfig(MLPConfig):
    """Hyper-parameters of the DataParallel reference run (the healthy defaults)."""
    device: str = "auto"


class DataParallelTrainer(MLPTrainer):
    """:class:`MLPTrainer` training ``nn.DataParallel(MLP)``."""

    def wrap(self, net: nn.Module) -> nn.Module:
        return nn.DataParallel(net)


SPEC = register_arch(ArchSpec(
    name="dataparallel", family="mlp", config=DataParallelConfig, trainer=DataParallelTrainer,
    task="the mlp task, trained through nn.DataParallel (one device on a CPU-only machine)",
    input_layer="blocks.0.fc", unstable_layer="blocks.0.fc", labels_at=1,
    notes="NeuralDbg gets the DataParallel wrapper; layer names are the inner module's",
))
register_general("dataparallel", GENERAL + LABEL_FAULTS)
