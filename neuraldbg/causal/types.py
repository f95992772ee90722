"""Result records of the causal engine: plain, frozen, tensor-free.

Everything here is built from :class:`~neuraldbg.events.base.Event` records and floats, so a
result can be hashed, compared, pickled, printed and written to JSON without torch or pgmpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from neuraldbg.events.base import Event
from neuraldbg.vocab import phrase

#: events shown by ``str(CausalChain)`` before eliding the rest
MAX_LINKS = 8
#: A run is *healthy* when ``P(healthy) >= HEALTHY_AT``: more likely than not, every root cause
#: is ok (``docs/api.md``, "Causal queries"). Each root's ``ok`` is at least ``P(healthy)``, so
#: no abnormal state can then be more probable than a healthy run: the verdict agrees with the
#: posterior's most probable label, which is what the benchmark scores. Hypotheses (states at
#: or above the reporting floor, 0.2) may still be listed for a healthy run, as weaker leads.
HEALTHY_AT = 0.5


def _short(e: Event) -> str:
    where = e.layer if e.layer is not None else "loss"
    return f"{e.kind} in {where} at step {e.step}"


@dataclass(frozen=True)
class Hypothesis:
    """One abnormal root-cause state, ranked by its posterior marginal.

    ``cause``/``state`` name a root variable and one of its abnormal states (``docs/api.md``,
    :data:`neuraldbg.vocab.ROOTS`);
    ``probability`` is ``P(cause = state | evidence)``; ``evidence`` holds the events whose
    observation raised that probability (the likelihood ratio of their evidence variable
    favours this state over "all ok"). ``str(h)`` is ``h.description``.
    """

    cause: str
    state: str
    probability: float
    failure_type: str
    origin_layer: str | None
    onset_step: int | None
    evidence: tuple[Event, ...]
    suggested_fix: str
    description: str
    #: rank of the distributed process where the first event was seen (None: all ranks, or
    #: not distributed)
    origin_rank: int | None = None

    def __str__(self) -> str:
        return self.description

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (events as dicts)."""
        return {
            "cause": self.cause,
            "state": self.state,
            "probability": self.probability,
            "failure_type": self.failure_type,
            "origin_layer": self.origin_layer,
            "onset_step": self.onset_step,
            "evidence": [e.to_dict() for e in self.evidence],
            "suggested_fix": self.suggested_fix,
            "description": self.description,
            "origin_rank": self.origin_rank,
        }


@dataclass(frozen=True)
class CausalChain:
    """Root cause -> first event -> propagation, for one failure type.

    An empty chain (``cause is None``, ``first_event is None``) carries the ``reason`` why
    there is nothing to trace; ``bool(chain)`` is ``False`` then.
    """

    failure_type: str
    cause: str | None
    state: str | None
    probability: float
    first_event: Event | None
    propagation: tuple[Event, ...] = ()
    reason: str = ""

    @property
    def first_layer(self) -> str | None:
        """Layer of the first event (``None`` for a loss event or an empty chain)."""
        return self.first_event.layer if self.first_event is not None else None

    @property
    def first_step(self) -> int | None:
        """Step of the first event (``None`` for an empty chain)."""
        return self.first_event.step if self.first_event is not None else None

    @property
    def empty(self) -> bool:
        """True when the failure type did not occur (see ``reason``)."""
        return self.first_event is None

    @property
    def events(self) -> tuple[Event, ...]:
        """First event followed by the propagation, in order."""
        return ((self.first_event,) if self.first_event is not None else ()) + self.propagation

    def __bool__(self) -> bool:
        return not self.empty

    def __str__(self) -> str:
        if self.empty:
            return f"{self.failure_type}: no chain ({self.reason})"
        head = (f"{phrase(self.cause, self.state or '')} (p = {self.probability:.2f})" if self.cause
                else "unexplained (no root cause above the reporting floor)")
        evs = self.events
        links = [head] + [_short(e) for e in evs[:MAX_LINKS]]
        if len(evs) > MAX_LINKS:
            links.append(f"... {len(evs) - MAX_LINKS} more")
        return f"{self.failure_type}: " + " -> ".join(links)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "failure_type": self.failure_type,
            "cause": self.cause,
            "state": self.state,
            "probability": self.probability,
            "first_layer": self.first_layer,
            "first_step": self.first_step,
            "first_event": self.first_event.to_dict() if self.first_event else None,
            "propagation": [e.to_dict() for e in self.propagation],
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Coupling:
    """Two event kinds that co-occur in a layer or adjacent layers more often than chance.

    ``kind_a``/``kind_b`` are event kinds (unique across event types, e.g. ``vanishing``,
    ``saturated``), ``a`` being the kind that starts first.
    ``strength`` is the lift ``P(a near b) / (P(a) P(b near))`` over (layer, step-bin) cells,
    ``co_occurrences`` the cells where both occur, ``expected`` the count chance predicts,
    ``p_value`` the one-sided hypergeometric tail of seeing at least that many, and ``lag``
    the median number of steps from ``a``'s onset to ``b``'s onset where they co-occur.
    """

    kind_a: str
    kind_b: str
    layers: tuple[str, ...]
    relation: str  # "same_layer" or "adjacent_layers"
    lag: float
    strength: float
    co_occurrences: int
    expected: float
    p_value: float
    first_step: int

    def __str__(self) -> str:
        where = ", ".join(self.layers[:4]) + ("..." if len(self.layers) > 4 else "")
        return (f"{self.kind_a} + {self.kind_b} ({self.relation.replace('_', ' ')}: {where}), "
                f"lift {self.strength:.2f}, {self.co_occurrences} co-occurrences vs {self.expected:.2f} "
                f"by chance (p={self.p_value:.2g}), lag {self.lag:+g} steps, from step {self.first_step}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


class Posterior(dict):
    """``variable -> {state: p}`` for every root variable, plus ``"healthy"``.

    ``posterior["healthy"] == {"yes": p, "no": 1 - p}`` with ``p = P(all root causes ok |
    evidence)``, also available as ``.p_healthy``. ``.evidence`` holds the discretized
    evidence the posterior conditions on (unobserved variables are absent), ``.source`` the
    prior source (family name or file path). ``.nothing_observed``: the monitor saw neither a
    loss nor any layer statistics, so this is the prior and no finding about the run.
    ``.ruled_out``: ``(variable, state) -> why`` for the states the run lacks the preconditions of
    (probability 0 here).
    """

    def __init__(self, marginals: Mapping[str, Mapping[str, float]], p_healthy: float,
                 evidence: Mapping[str, str] | None = None, source: str = "", nothing_observed: bool = False,
                 ruled_out: Mapping[tuple[str, str], str] | None = None) -> None:
        super().__init__({v: dict(d) for v, d in marginals.items()})
        self["healthy"] = {"yes": float(p_healthy), "no": float(1.0 - p_healthy)}
        self.p_healthy = float(p_healthy)
        self.evidence = dict(evidence or {})
        self.source = source
        self.nothing_observed = bool(nothing_observed)
        self.ruled_out = dict(ruled_out or {})

    @property
    def is_healthy(self) -> bool:
        """The verdict: ``P(healthy) >= HEALTHY_AT`` (0.5), the one definition of a healthy run."""
        return self.p_healthy >= HEALTHY_AT

    def abnormal(self) -> list[tuple[str, str, float]]:
        """Every abnormal ``(variable, state, p)``, most probable first."""
        out = [(v, s, p) for v, d in self.items() if v != "healthy"
               for s, p in d.items() if s != "ok"]
        return sorted(out, key=lambda t: -t[2])

    def __repr__(self) -> str:
        if self.nothing_observed:
            return f"Posterior(nothing observed: the prior, p_healthy={self.p_healthy:.4f}, {dict.__repr__(self)})"
        return f"Posterior(p_healthy={self.p_healthy:.4f}, {dict.__repr__(self)})"

    def __reduce__(self):  # keep extra attributes through pickle/copy
        marg = {k: v for k, v in self.items() if k != "healthy"}
        return (Posterior, (marg, self.p_healthy, self.evidence, self.source, self.nothing_observed, self.ruled_out))


@dataclass(frozen=True)
class VariableCoverage:
    """How the diagnosis read one evidence variable: ``observed`` (its ``state``), or not and
    ``reason`` why; ``gap`` when the monitor did not measure what it reads (no optimizer found,
    a monitor error, an unsupported tensor type, not at initialization) rather than the run not
    being able to show it (no ReLU to die, no reference loss given)."""

    variable: str
    observed: bool
    reason: str | None = None
    gap: bool = False
    state: Any = None

    def __str__(self) -> str:
        if self.observed:
            state = "/".join(self.state) if isinstance(self.state, tuple) else self.state
            return f"{self.variable}: {state}"
        return f"{self.variable}: not observed ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        state = list(self.state) if isinstance(self.state, tuple) else self.state
        return {"variable": self.variable, "observed": self.observed, "reason": self.reason, "gap": self.gap,
                "state": state}


class Coverage(dict):
    """``variable -> VariableCoverage`` for every evidence variable of the network: what the
    diagnosis saw and what it did not (``docs/api.md``, "Coverage").

    ``internal_errors`` counts the monitor's own failures during the run; ``nothing_observed`` is
    true when the monitor saw neither a loss nor any layer statistics, so the posterior is the
    prior and says nothing about this run; ``unobserved_ranks`` names the ranks of a distributed
    job the merge did not see to the end (``docs/distributed.md``).
    """

    def __init__(self, entries: Mapping[str, VariableCoverage], internal_errors: int = 0,
                 nothing_observed: bool = False, unobserved_ranks: str | None = None) -> None:
        super().__init__(entries)
        self.internal_errors = int(internal_errors)
        self.nothing_observed = bool(nothing_observed)
        #: ranks of a distributed job whose trace the live merge did not get, and from when on
        self.unobserved_ranks = unobserved_ranks

    def unobserved(self) -> dict[str, str]:
        """``variable -> reason`` of every variable not observed."""
        return {v: c.reason or "" for v, c in self.items() if not c.observed}

    def gaps(self) -> dict[str, str]:
        """``variable -> reason`` of the variables the monitor did not measure."""
        return {v: c.reason or "" for v, c in self.items() if c.gap}

    def summary(self) -> str:
        """One sentence: how much was observed, what the monitor missed, its errors."""
        if self.nothing_observed:
            head = "nothing was observed (no loss and no layer statistics): the posterior is the prior"
        else:
            head = f"{sum(c.observed for c in self.values())} of {len(self)} evidence variables observed"
        gaps = self.gaps()
        if gaps and not self.nothing_observed:
            by_reason: dict[str, list[str]] = {}
            for v, why in gaps.items():
                by_reason.setdefault(why, []).append(v)
            head += "; not measured: " + "; ".join(f"{', '.join(vs)} ({why})" for why, vs in by_reason.items())
        if self.unobserved_ranks:
            head += f"; unobserved: {self.unobserved_ranks}"
        if self.internal_errors:
            head += f"; {self.internal_errors} internal error{'s' if self.internal_errors != 1 else ''} of the monitor"
        return head

    def __str__(self) -> str:
        return "\n".join([self.summary()] + [f"  {c}" for c in self.values()])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"nothing_observed": self.nothing_observed, "internal_errors": self.internal_errors,
                "variables": {v: c.to_dict() for v, c in self.items()}}

    def __reduce__(self):  # keep extra attributes through pickle/copy
        return (Coverage, (dict(self), self.internal_errors, self.nothing_observed, self.unobserved_ranks))
