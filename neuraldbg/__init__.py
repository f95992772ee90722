"""NeuralDBG: tells you *why* a PyTorch training run failed.

``with NeuralDbg(model) as dbg:`` around an unchanged loop collects cheap statistics,
turns them into semantic events and ranks root causes with a Bayesian network.

Importing this package loads neither torch nor pgmpy: every public name is resolved on first
use (PEP 562), so the pure parts (:mod:`neuraldbg.vocab`, :mod:`neuraldbg.causal.structure`,
reading a session) work without them. ``docs/api.md`` is the public contract.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from neuraldbg.vocab import EVENT_KINDS, EVENT_TYPES, FAILURE_TYPES

__version__ = "0.1.0"

#: public name -> module that defines it (imported when the name is first used)
_LAZY: dict[str, str] = {
    "NeuralDbg": "neuraldbg.monitor.monitor",
    "DetectorConfig": "neuraldbg.config",
    "Event": "neuraldbg.events.base",
    "register_detector": "neuraldbg.events.registry",
    "Session": "neuraldbg.session",
    "load_session": "neuraldbg.session",
    "save_session": "neuraldbg.session",
    "merge_sessions": "neuraldbg.distributed",
    "Hypothesis": "neuraldbg.causal.types",
    "CausalChain": "neuraldbg.causal.types",
    "Coupling": "neuraldbg.causal.types",
    "Coverage": "neuraldbg.causal.types",
    "Posterior": "neuraldbg.causal.types",
    "VariableCoverage": "neuraldbg.causal.types",
    "Verification": "neuraldbg.verify.types",
}

__all__ = sorted(_LAZY) + ["EVENT_TYPES", "EVENT_KINDS", "FAILURE_TYPES", "__version__"]

if TYPE_CHECKING:  # pragma: no cover - static names for type checkers and IDEs (the lazy table's)
    from neuraldbg.causal.types import (  # noqa: F401
        CausalChain, Coupling, Coverage, Hypothesis, Posterior, VariableCoverage)
    from neuraldbg.config import DetectorConfig  # noqa: F401
    from neuraldbg.distributed import merge_sessions  # noqa: F401
    from neuraldbg.events.base import Event  # noqa: F401
    from neuraldbg.events.registry import register_detector  # noqa: F401
    from neuraldbg.monitor.monitor import NeuralDbg  # noqa: F401
    from neuraldbg.session import Session, load_session, save_session  # noqa: F401
    from neuraldbg.verify.types import Verification  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'neuraldbg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
