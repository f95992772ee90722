"""The causal engine: a Bayesian network over root causes of a failed training run.

Importing this package is cheap (no pgmpy, no torch): the queries live in
:mod:`neuraldbg.causal.api`, the network declaration in :mod:`neuraldbg.causal.structure`,
and pgmpy is only loaded by :mod:`neuraldbg.causal.network` when a model is built or checked.
"""
from __future__ import annotations

from neuraldbg.causal.types import CausalChain, Coupling, Hypothesis, Posterior

__all__ = ["CausalChain", "Coupling", "Hypothesis", "Posterior"]
