"""From a :class:`~neuraldbg.trace.Trace` to discretized evidence: every evidence node reads it.

Each evidence node of the network carries its own extractor (``neuraldbg/causal/nodes/``, where
its cut points are documented); :func:`extract` hands every extractor one shared
:class:`~neuraldbg.causal.view.TraceView` and collects the readings. A variable is **observed**
when the trace could have shown it and **unobserved** otherwise -- with a reason, which the
engine marginalizes exactly and the diagnosis reports. Some observations are *partial*: a set of
states (e.g. for a GAN's loss, "none of spike, divergence, non-finite" without telling
decreasing from flat), which the engine handles exactly as the disjunction of those states.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from neuraldbg.causal.structure import Network, default_network
from neuraldbg.causal.view import TraceView
from neuraldbg.events.base import Event
from neuraldbg.trace import Trace


@dataclass(frozen=True)
class Evidence:
    """Discretized evidence of one trace.

    ``observed`` maps an evidence variable to a state, or to a tuple of states for a partial
    observation; unobserved variables are absent from it and listed in ``unobserved`` with the
    reason; ``gaps`` those the monitor did not measure (no optimizer found, not at
    initialization...). ``support`` gives the events behind each reading and ``notes`` a short
    sentence.
    """

    observed: Mapping[str, str | tuple[str, ...]]
    support: Mapping[str, tuple[Event, ...]] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    unobserved: Mapping[str, str] = field(default_factory=dict)
    #: the unobserved variables the monitor did not measure (a subset of ``unobserved``)
    gaps: Mapping[str, str] = field(default_factory=dict)


def extract(trace: Trace, network: Network | None = None) -> Evidence:
    """Discretize ``trace`` into the evidence variables of ``network`` (default: this version's)."""
    net = network if network is not None else default_network()
    view = TraceView(trace)
    obs: dict[str, str | tuple[str, ...]] = {}
    sup: dict[str, tuple[Event, ...]] = {}
    notes: dict[str, str] = {}
    missing: dict[str, str] = {}
    gaps: dict[str, str] = {}
    for name in net.evidence_names:
        reading = net.node_by_name[name].extract(view)
        if reading is None or reading.state is None:
            missing[name] = reading.reason if reading is not None and reading.reason else "not measured"
            if reading is not None and reading.gap:
                gaps[name] = missing[name]
        else:
            obs[name] = reading.state
        if reading is not None:
            if reading.support or reading.state is not None:
                sup[name] = reading.support
            if reading.note:
                notes[name] = reading.note
    return Evidence(obs, sup, notes, missing, gaps)
