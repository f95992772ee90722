"""Coupled failures: event kinds that co-occur in a layer or adjacent layers beyond chance.

The trace is cut into cells ``(layer, step bin)`` over the monitored layers (plus the loss,
as a pseudo-layer after the last one) and the observed steps. A kind is *active* in a cell
when one of its events spans that bin in that layer. For two kinds ``a`` and ``b`` the
*neighbourhood* of a cell is the same or an adjacent layer (forward order) within
``LAG_BINS`` bins either side. Then

* ``co_occurrences`` = cells where ``a`` is active and ``b`` is active in the neighbourhood,
* ``expected`` = ``n_a * q_b``, with ``q_b`` the fraction of *all* cells that have ``b`` in
  their neighbourhood (what a random placement of ``a``'s cells would give),
* ``strength`` = lift = ``co_occurrences / expected``,
* ``p_value`` = hypergeometric tail: drawing ``n_a`` cells at random, at least
  ``co_occurrences`` land next to ``b``.

A coupling is reported when the lift is at least ``MIN_LIFT``, at least ``MIN_CO`` cells
co-occur and the tail probability is at most ``MAX_P``, so two kinds that are everywhere (or
merely close in time somewhere) are not "coupled". ``lag`` is the median, over the layers where
they meet, of ``b``'s onset minus ``a``'s onset (``a`` is the kind that starts first overall).
"""
from __future__ import annotations

import math
from statistics import median

from neuraldbg.causal.types import Coupling
from neuraldbg.events.base import Event
from neuraldbg.trace import Trace

N_BINS = 50
LAG_BINS = 1
MIN_LIFT = 1.2
MIN_CO = 2
MAX_P = 0.05
LOSS = "<loss>"


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _hypergeom_sf(k: int, population: int, successes: int, draws: int) -> float:
    """P(X >= k) for X ~ Hypergeometric(population, successes, draws), in log space."""
    hi = min(successes, draws)
    lo = max(k, 0, draws - (population - successes))
    if lo > hi:
        return 0.0
    log_total = _log_comb(population, draws)
    terms = [_log_comb(successes, i) + _log_comb(population - successes, draws - i) - log_total
             for i in range(lo, hi + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def couplings(trace: Trace) -> list[Coupling]:
    """Couplings between event kinds, strongest (lift) first."""
    events = [e for e in trace.events]
    if not events:
        return []
    order = [li.name for li in sorted(trace.layers, key=lambda x: x.index)]
    pos = {name: i for i, name in enumerate(order)}
    for e in events:  # events on layers missing from the layer list still get a row
        if e.layer is not None and e.layer not in pos:
            pos[e.layer] = len(pos)
    pos[LOSS] = len(pos)
    n_layers = len(pos)
    lo = min(trace.first_step, min(e.step for e in events))
    hi = max(trace.last_step, max(e.end_step for e in events))
    span = hi - lo + 1
    n_bins = max(1, min(N_BINS, span))
    width = span / n_bins

    def bins(e: Event) -> range:
        return range(int((e.step - lo) / width), int((e.end_step - lo) / width) + 1)

    cells: dict[str, set[tuple[int, int]]] = {}
    onset: dict[tuple[str, int], int] = {}
    for e in events:
        k = e.kind  # kinds are unique across event types
        row = pos[e.layer if e.layer is not None else LOSS]
        s = cells.setdefault(k, set())
        for b in bins(e):
            s.add((row, min(b, n_bins - 1)))
        onset[(k, row)] = min(onset.get((k, row), e.step), e.step)
    first_step = {k: min(st for (kk, _), st in onset.items() if kk == k) for k in cells}
    population = n_layers * n_bins

    def hood(c: set[tuple[int, int]]) -> set[tuple[int, int]]:
        out = set()
        for r, b in c:
            for dr in (-1, 0, 1):
                for db in range(-LAG_BINS, LAG_BINS + 1):
                    rr, bb = r + dr, b + db
                    if 0 <= rr < n_layers and 0 <= bb < n_bins:
                        out.add((rr, bb))
        return out

    names = {v: k for k, v in pos.items()}
    kinds = sorted(cells, key=lambda k: (first_step[k], k))
    out: list[Coupling] = []
    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            ca, cb = cells[a], cells[b]
            hb = hood(cb)
            co_cells = ca & hb
            co = len(co_cells)
            expected = len(ca) * len(hb) / population
            if co < MIN_CO or expected <= 0:
                continue
            lift = co / expected
            if lift < MIN_LIFT:
                continue
            p_value = _hypergeom_sf(co, population, len(hb), len(ca))
            if p_value > MAX_P:
                continue
            rows_a = {r for r, _ in co_cells}
            rows_b = {r for r, _ in cb if any(abs(r - ra) <= 1 for ra in rows_a)}
            same = bool(rows_a & rows_b)
            lags = []
            for ra in rows_a:
                near = [onset[(b, rb)] for rb in (ra - 1, ra, ra + 1) if (b, rb) in onset]
                if (a, ra) in onset and near:
                    lags.append(min(near, key=lambda s: abs(s - onset[(a, ra)])) - onset[(a, ra)])
            layers = tuple(names[r] for r in sorted(rows_a | rows_b))
            out.append(Coupling(
                kind_a=a, kind_b=b, layers=layers,
                relation="same_layer" if same else "adjacent_layers",
                lag=float(median(lags)) if lags else 0.0,
                strength=lift, co_occurrences=co, expected=expected,
                p_value=p_value,
                first_step=min(first_step[a], first_step[b]),
            ))
    return sorted(out, key=lambda c: (-c.strength, c.p_value))
