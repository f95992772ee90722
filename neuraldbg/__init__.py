"""NeuralDBG: tells you *why* a PyTorch training run failed.

``with NeuralDbg(model) as dbg:`` around an unchanged loop collects cheap statistics,
turns them into semantic events and ranks root causes with a Bayesian network.
Importing this package does not import pgmpy (the causal engine loads it lazily).
"""
from neuraldbg.config import DetectorConfig
from neuraldbg.distributed import merge_sessions
from neuraldbg.events.base import EVENT_KINDS, EVENT_TYPES, FAILURE_TYPES, Event
from neuraldbg.events.registry import register_detector
from neuraldbg.monitor.monitor import NeuralDbg
from neuraldbg.session import Session, load_session

__version__ = "0.1.0"

__all__ = ["NeuralDbg", "Event", "DetectorConfig", "Session", "load_session", "merge_sessions", "register_detector",
           "EVENT_TYPES", "EVENT_KINDS", "FAILURE_TYPES", "__version__"]


def __getattr__(name):
    # frozen result records live with the causal engine; import them on first use
    if name in ("Hypothesis", "CausalChain", "Coupling"):
        from neuraldbg.causal import types

        return getattr(types, name)
    raise AttributeError(f"module 'neuraldbg' has no attribute {name!r}")
