"""Causal queries shared by the live monitor and a session loaded from disk.

Both :class:`neuraldbg.NeuralDbg` and :class:`neuraldbg.session.Session` inherit this mixin;
each supplies a :class:`~neuraldbg.trace.Trace` and a prior source. The causal engine (and
pgmpy behind it) is imported lazily on the first query, never on ``import neuraldbg``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuraldbg.vocab import validate_failure_type

if TYPE_CHECKING:  # pragma: no cover
    from neuraldbg.causal.types import CausalChain, Coupling, Hypothesis
    from neuraldbg.trace import Trace


class CausalQueries:
    """Mixin: the public causal queries of ``docs/api.md``, answered from ``self.trace()``."""

    #: family name used for priors (set by subclasses)
    family: str
    #: path of a tuned prior file, or None for the shipped family priors
    priors_path: str | None = None

    def trace(self) -> "Trace":  # pragma: no cover - abstract
        """The events and context the queries read."""
        raise NotImplementedError

    def _engine(self) -> Any:
        from neuraldbg.causal import api

        return api

    def posterior(self) -> dict[str, dict[str, float]]:
        """Posterior of every root-cause variable (each sums to 1) and ``P(healthy)``.

        The result is a dict ``variable -> {state: p}``; key ``"healthy"`` holds
        ``{"yes": P(all causes ok), "no": 1 - P}`` and attribute ``p_healthy`` the same number.
        """
        return self._engine().posterior(self.trace(), priors=self.priors_path)

    def get_causal_hypotheses(self) -> list["Hypothesis"]:
        """Ranked hypotheses (highest probability first) above the reporting floor."""
        return self._engine().hypotheses(self.trace(), priors=self.priors_path)

    def explain_failure(self, failure_type: str | None = None) -> list["Hypothesis"]:
        """Hypotheses that explain ``failure_type`` (all of them when ``None``)."""
        if failure_type is not None:
            validate_failure_type(failure_type)
        return self._engine().explain(self.trace(), failure_type, priors=self.priors_path)

    def trace_causal_chain(self, failure_type: str) -> "CausalChain":
        """Root cause -> first event -> propagation, for one failure type."""
        validate_failure_type(failure_type)
        return self._engine().causal_chain(self.trace(), failure_type, priors=self.priors_path)

    def export_aquarium_package(self, path) -> str:  # pragma: no cover - abstract
        """Write the session as one versioned JSON document (atomically); returns the path."""
        raise NotImplementedError

    def save_session(self, path) -> str:
        """The plain-named twin of :meth:`export_aquarium_package`."""
        return self.export_aquarium_package(path)

    def detect_coupled_failures(self) -> list["Coupling"]:
        """Pairs of event kinds that co-occur in a layer or adjacent layers."""
        return self._engine().couplings(self.trace())
