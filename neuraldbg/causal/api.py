"""The causal queries: ``posterior``, ``hypotheses``, ``explain``, ``causal_chain``, ``couplings``.

Every query takes a :class:`~neuraldbg.trace.Trace` and a prior source (``priors``: a path
to a tuned prior file, a :class:`~neuraldbg.causal.priors.Priors`, or ``None`` for the shipped
priors of ``trace.family``). Light to import: numpy and the pure-Python network declaration,
never pgmpy. The compiled network is cached per prior source (fingerprint of the validated
content), so a query after the first costs the feature extraction plus one enumeration.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from neuraldbg.causal import evidence as _evidence
from neuraldbg.causal import hypotheses as _hyp
from neuraldbg.causal.compiled import HEALTHY_KEY, CompiledNetwork
from neuraldbg.causal.couplings import couplings as _couplings
from neuraldbg.causal.cpd import build_cpds
from neuraldbg.causal.priors import Priors, load_priors
from neuraldbg.causal.structure import default_network
from neuraldbg.causal.types import CausalChain, Coupling, Coverage, Hypothesis, Posterior, VariableCoverage
from neuraldbg.causal.view import TraceView
from neuraldbg.trace import Trace
from neuraldbg.vocab import validate_failure_type

log = logging.getLogger("neuraldbg")

REPORT_FLOOR = _hyp.REPORT_FLOOR

_lock = threading.Lock()
_compiled: dict[str, CompiledNetwork] = {}


def resolve_priors(trace: Trace | None = None, priors: Any = None, family: str | None = None) -> Priors:
    """The :class:`Priors` for a query: ``priors`` if given (path or object), else the
    shipped priors of ``family`` or ``trace.family``."""
    if isinstance(priors, Priors):
        return priors
    fam = family if family is not None else (trace.family if trace is not None else None)
    if priors is not None:
        if not isinstance(priors, (str, os.PathLike)):
            raise TypeError(f"priors must be a path, a Priors or None, got {type(priors).__name__}")
        return load_priors(family=fam, path=priors)
    return load_priors(family=fam)


def compiled(priors: Priors) -> CompiledNetwork:
    """The compiled network of a prior source (built once per distinct content)."""
    net = _compiled.get(priors.fingerprint)
    if net is None:
        with _lock:
            net = _compiled.get(priors.fingerprint)
            if net is None:
                network = default_network()
                cpds = build_cpds(priors.roots, priors.cpds, network)
                net = CompiledNetwork(cpds, network, temperature=priors.temperature, source=priors.source)
                _compiled[priors.fingerprint] = net
                log.debug("compiled causal network for %s (%d hidden states)", priors.source, net.n_hidden)
    return net


def _setup(trace: Trace, priors: Any) -> tuple[CompiledNetwork, _evidence.Evidence, Posterior]:
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a neuraldbg.trace.Trace, got {type(trace).__name__}")
    pri = resolve_priors(trace, priors)
    net = compiled(pri)
    ev = _evidence.extract(trace, net.network)
    ruled_out = impossible(trace)
    marg, p_ok = net.posterior(ev.observed, ruled_out)
    nothing = trace.loss.n == 0 and not TraceView(trace).watched
    post = Posterior(marg, p_ok, evidence=ev.observed, source=pri.source, nothing_observed=nothing,
                     ruled_out=ruled_out)
    return net, ev, post


def impossible(trace: Trace) -> dict[tuple[str, str], str]:
    """The root states ``trace`` lacks the preconditions of (``neuraldbg/causal/nodes/``,
    ``PRECONDITIONS``), each with why: they have probability 0 whatever else the run shows, so
    that no hypothesis rests on evidence its own cause does not produce. ``HEALTHY_KEY`` among
    them when the run cannot be healthy (a loss that stays near chance level: ``never_healthy``)."""
    from neuraldbg.causal.nodes import preconditions
    from neuraldbg.causal.nodes.loss import never_healthy

    view = TraceView(trace)
    out: dict[tuple[str, str], str] = {}
    for pre in preconditions():
        why = pre.lacks(view)
        if why is not None:
            out[(pre.cause, pre.state)] = f"{pre.needs}: {why}"
    if (why := never_healthy(view)) is not None:
        out[HEALTHY_KEY] = why
    return out


def evidence(trace: Trace) -> _evidence.Evidence:
    """The discretized evidence of ``trace`` (what the posterior conditions on)."""
    return _evidence.extract(trace)


def posterior(trace: Trace, priors: Any = None) -> Posterior:
    """Every root variable's posterior distribution plus ``"healthy"`` (see :class:`Posterior`)."""
    return _setup(trace, priors)[2]


def hypotheses(trace: Trace, priors: Any = None, *, floor: float = REPORT_FLOOR) -> list[Hypothesis]:
    """One :class:`Hypothesis` per abnormal root state with posterior >= ``floor``, highest first;
    none when nothing was observed (the posterior is then the prior: no finding about this run)."""
    net, ev, post = _setup(trace, priors)
    if post.nothing_observed:
        return []
    return _hyp.hypotheses(trace, post, net, ev, floor)


def explain(trace: Trace, failure_type: str | None, priors: Any = None, *,
            floor: float = REPORT_FLOOR) -> list[Hypothesis]:
    """Hypotheses (>= ``floor``) that explain ``failure_type``; all of them for ``None``; none
    when nothing was observed.

    Raises ``ValueError`` naming the six valid failure types for an unknown one.
    """
    if failure_type is not None:
        validate_failure_type(failure_type)
    net, ev, post = _setup(trace, priors)
    if post.nothing_observed:  # as for hypotheses(): the prior is no finding about this run
        return []
    return _hyp.explain(trace, post, net, ev, failure_type, floor)


def causal_chain(trace: Trace, failure_type: str, priors: Any = None) -> CausalChain:
    """Root cause -> first event (layer, step) -> propagation; empty with a reason if the
    failure did not occur."""
    validate_failure_type(failure_type)
    net, ev, post = _setup(trace, priors)
    return _hyp.chain(trace, post, net, ev, failure_type)


def coverage_of(trace: Trace, ev: _evidence.Evidence) -> Coverage:
    """The :class:`Coverage` of ``trace`` from its extracted evidence ``ev`` (every variable of
    the network is in one of ``ev.observed`` and ``ev.unobserved``)."""
    entries = {}
    for name in [n for n in default_network().evidence_names if n in ev.observed or n in ev.unobserved]:
        if name in ev.observed:
            entries[name] = VariableCoverage(name, True, state=ev.observed[name])
        else:
            entries[name] = VariableCoverage(name, False, reason=ev.unobserved[name], gap=name in ev.gaps)
    nothing = trace.loss.n == 0 and not TraceView(trace).watched
    from neuraldbg.causal.nodes.run import UNOBSERVED_RANKS

    return Coverage(entries, internal_errors=trace.internal_errors, nothing_observed=nothing,
                    unobserved_ranks=trace.signatures.value(UNOBSERVED_RANKS))


def coverage(trace: Trace) -> Coverage:
    """What the diagnosis of ``trace`` observed, and why not the rest (see :class:`Coverage`)."""
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a neuraldbg.trace.Trace, got {type(trace).__name__}")
    return coverage_of(trace, _evidence.extract(trace))


def couplings(trace: Trace) -> list[Coupling]:
    """Pairs of event kinds co-occurring in a layer or adjacent layers beyond chance."""
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a neuraldbg.trace.Trace, got {type(trace).__name__}")
    return _couplings(trace)

