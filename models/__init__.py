"""The NeuralDBG model zoo: small reference architectures with failure injectors.

Every architecture is one readable file (a config dataclass, the model, a seeded in-process
data maker, a trainer); every injection is a small record with its ground-truth root cause.
One runner drives them all, with or without the monitor::

    import models
    models.architectures()                  # ['mlp', 'cnn', 'transformer', ...]
    [i.name for i in models.injections("rl")]
    r = models.run("rl", "lr_too_high", seed=0, monitor=True)
    r.losses, r.truth, r.dbg.get_causal_hypotheses()

``python -m models`` lists the zoo and the ground truth of every injection;
docs/models.md explains each architecture, its task and why each injection maps to its cause.
The registry (``Trainer``, ``ArchSpec``, shared helpers) is :mod:`models.registry`, the one
runner :mod:`models.runner`, the failure injectors :mod:`models.injections`.
"""
# ruff: noqa: I001  (importing an architecture file registers it: the import order is the listing order)
from models.registry import (
    FAMILIES,
    ArchSpec,
    Trainer,
    architectures,
    default_config,
    family,
    get_arch,
    register_arch,
)
from models.injections import (
    ONSET_FRAC,
    Injection,
    all_injections,
    get_injection,
    injection_names,
    injections,
    register_injection,
)
from models.runner import RunResult, run

# importing an architecture file registers it (and its own injections); order = listing order
from models import mlp, cnn, transformer, dcgan, lora, diffusion, lstm, gnn, rl  # noqa: E402,F401
from models import compiled, dataparallel  # noqa: E402,F401

__all__ = [
    "FAMILIES", "ONSET_FRAC", "ArchSpec", "Injection", "RunResult", "Trainer",
    "all_injections", "architectures", "default_config", "family", "get_arch",
    "get_injection", "injection_names", "injections", "register_arch",
    "register_injection", "run",
]
