"""Causal queries shared by the live monitor and a session loaded from disk.

Both :class:`neuraldbg.NeuralDbg` and :class:`neuraldbg.session.Session` inherit this mixin;
each supplies a :class:`~neuraldbg.trace.Trace` and a prior source (``_priors``). The causal engine (and
pgmpy behind it) is imported lazily on the first query, never on ``import neuraldbg``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuraldbg.vocab import validate_failure_type

if TYPE_CHECKING:  # pragma: no cover
    from neuraldbg.causal.priors import Priors
    from neuraldbg.causal.types import CausalChain, Coupling, Coverage, Hypothesis, Posterior
    from neuraldbg.trace import Trace


class CausalQueries:
    """Mixin: the public causal queries of ``docs/api.md``, answered from ``self.trace()``."""

    #: family name used for priors (set by subclasses)
    family: str
    #: path of the tuned prior file a monitor was given (informational; see ``priors``)
    priors_path: str | None = None
    #: the validated priors the queries use; None for the family's shipped priors
    _priors: Any = None

    def trace(self) -> "Trace":  # pragma: no cover - abstract
        """The events and context of this run (of this rank, in a distributed job)."""
        raise NotImplementedError

    def _diagnosed(self) -> "Trace":
        """The trace the queries answer for: :meth:`trace`, unless a subclass knows more (a
        monitor on rank 0 of a distributed job answers for the whole job once it has exited)."""
        return self.trace()

    @property
    def priors(self) -> "Priors":
        """The :class:`~neuraldbg.causal.priors.Priors` the queries use (and exports embed)."""
        from neuraldbg.causal.priors import load_priors

        return self._priors if self._priors is not None else load_priors(family=self.family)

    def _engine(self) -> Any:
        from neuraldbg.causal import api

        return api

    def _ask(self, query: str, *args: Any) -> Any:
        from neuraldbg.causal.compiled import ImpossibleEvidence

        pri = self.priors
        try:
            return getattr(self._engine(), query)(self._diagnosed(), *args, priors=pri)
        except ImpossibleEvidence as exc:  # only fitted zeros can cause it: name the priors at fault
            raise ImpossibleEvidence(f"{exc} of {pri.source}: a table there gives this run's evidence "
                                     "probability 0; refit it or add small probabilities") from None

    def posterior(self) -> "Posterior":
        """Posterior of every root-cause variable (each sums to 1) and ``P(healthy)``.

        The result is a :class:`~neuraldbg.causal.types.Posterior`, a dict ``variable ->
        {state: p}``; key ``"healthy"`` holds ``{"yes": P(all causes ok), "no": 1 - P}``,
        attribute ``p_healthy`` the same number and ``is_healthy`` the verdict (``docs/api.md``).
        """
        return self._ask("posterior")

    def coverage(self) -> "Coverage":
        """Every evidence variable: observed, or not and why (no optimizer found, a monitor
        error, an unsupported tensor type, not at initialization...), plus the monitor's
        internal error count (see :class:`~neuraldbg.causal.types.Coverage`)."""
        return self._engine().coverage(self._diagnosed())

    def get_causal_hypotheses(self) -> list["Hypothesis"]:
        """Ranked hypotheses (highest probability first) above the reporting floor."""
        return self._ask("hypotheses")

    def explain_failure(self, failure_type: str | None = None) -> list["Hypothesis"]:
        """Hypotheses that explain ``failure_type`` (all of them when ``None``)."""
        if failure_type is not None:
            validate_failure_type(failure_type)
        return self._ask("explain", failure_type)

    def trace_causal_chain(self, failure_type: str) -> "CausalChain":
        """Root cause -> first event -> propagation, for one failure type."""
        validate_failure_type(failure_type)
        return self._ask("causal_chain", failure_type)

    def export_aquarium_package(self, path) -> str:  # pragma: no cover - abstract
        """Write the session as one versioned JSON document (atomically); returns the path."""
        raise NotImplementedError

    def save_session(self, path) -> str:
        """The plain-named twin of :meth:`export_aquarium_package`."""
        return self.export_aquarium_package(path)

    def detect_coupled_failures(self) -> list["Coupling"]:
        """Pairs of event kinds that co-occur in a layer or adjacent layers."""
        return self._engine().couplings(self._diagnosed())

    def report(self, path) -> str:
        """Write the self-contained HTML report of this run to ``path``; returns the path."""
        from neuraldbg.report.html import write_report

        return write_report(self, path)

    def to_tensorboard(self, writer, top: int = 3) -> list[int]:
        """Write P(healthy) and the top hypotheses per checked step, and the diagnosis as text,
        to a TensorBoard ``SummaryWriter``; returns the steps written."""
        from neuraldbg.report.tensorboard import to_tensorboard

        return to_tensorboard(self, writer, top=top)
