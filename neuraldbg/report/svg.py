"""Inline SVG charts for the HTML report: plain strings, no plotting library, no network.

Each function returns one ``<svg>`` element drawn in a :data:`WIDTH`-unit ``viewBox``; the
page's CSS scales it down to narrow screens (never wider than :data:`WIDTH` CSS pixels).
Colours are fixed per event kind (:data:`KIND_COLORS`) so the loss curve, the event map and
the legend agree. Axis ticks are round numbers (:func:`nice_ticks`), decades on a log scale
(:func:`decade_ticks`).
"""
from __future__ import annotations

import math
from html import escape
from typing import Iterable, Sequence

from neuraldbg.events.base import Event
from neuraldbg.vocab import ALL_EVENT_KINDS

#: one colour per event kind (a colour-blind-friendly categorical palette)
KIND_COLORS: dict[str, str] = dict(zip(ALL_EVENT_KINDS, (
    "#4c78a8", "#e45756", "#72b7b2", "#54a24b", "#f58518", "#9d9d9d", "#b279a2", "#222222", "#9d755d",
    "#d4a72c")))

WIDTH = 920
LEFT = 150   # room for layer names
RIGHT = 20


def probability(p: float) -> str:
    """A probability as the report writes every one: two decimals, as in the hypotheses'
    sentences (``p=0.77``)."""
    return f"{p:.2f}"


def color(kind: str) -> str:
    """The colour of an event kind (grey for a kind this palette does not know)."""
    return KIND_COLORS.get(kind, "#777777")


def _fmt(x: float) -> str:
    return f"{x:.1f}"


class StepScale:
    """Steps ``lo..hi`` onto pixels ``x0..x1`` (one step is a band of width :attr:`band`)."""

    def __init__(self, lo: int, hi: int, x0: float = LEFT, x1: float = WIDTH - RIGHT) -> None:
        self.lo, self.hi = lo, max(hi, lo)
        self.x0, self.x1 = x0, x1
        self.band = (x1 - x0) / (self.hi - self.lo + 1)

    def __call__(self, step: float) -> float:
        return self.x0 + (step - self.lo) * self.band

    def ticks(self, n: int = 8) -> list[int]:
        """About ``n`` round step values within the range."""
        span = self.hi - self.lo + 1
        raw = max(1.0, span / n)
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
        first = int(math.ceil(self.lo / step) * step)
        return [int(t) for t in range(first, self.hi + 1, int(step))]


def _axis(sx: StepScale, y: float, label: str = "step") -> list[str]:
    out = [f'<line x1="{_fmt(sx.x0)}" y1="{_fmt(y)}" x2="{_fmt(sx.x1)}" y2="{_fmt(y)}" stroke="#888"/>']
    for t in sx.ticks():
        x = sx(t + 0.5)
        out.append(f'<line x1="{_fmt(x)}" y1="{_fmt(y)}" x2="{_fmt(x)}" y2="{_fmt(y + 4)}" stroke="#888"/>'
                   f'<text x="{_fmt(x)}" y="{_fmt(y + 15)}" text-anchor="middle" class="tick">{t}</text>')
    out.append(f'<text x="{_fmt(sx.x1)}" y="{_fmt(y + 28)}" text-anchor="end" class="tick">{escape(label)}</text>')
    return out


def _svg(height: float, body: Iterable[str], label: str) -> str:
    # width/height give the drawn size on a wide screen; the page's CSS (max-width: 100%,
    # height: auto) shrinks it with the viewBox's aspect ratio on a narrow one
    return (f'<svg role="img" aria-label="{escape(label)}" width="{WIDTH}" height="{_fmt(height)}" '
            f'viewBox="0 0 {WIDTH} {_fmt(height)}" preserveAspectRatio="xMinYMin meet">' + "".join(body) + "</svg>")


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """At most ``n + 1`` round values (steps of 1, 2 or 5 times a power of ten, the finest that
    fits) covering ``lo..hi``: the first at or below ``lo``, the last at or above ``hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"tick range must be finite, got {lo}..{hi}")
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    mag = 10 ** math.floor(math.log10((hi - lo) / max(1, n)))
    for step in (m * mag * 10 ** k for k in range(3) for m in (1, 2, 5)):
        first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
        if last - first <= n:
            break
    return [round(k * step, 12) for k in range(first, last + 1)]


def decade_ticks(lo_exp: float, hi_exp: float, n: int = 6) -> list[int]:
    """Powers of ten (as exponents) covering ``10**lo_exp..10**hi_exp``, every 1, 2, 5, 10...
    decades so that there are at most about ``n`` of them."""
    first, last = math.floor(lo_exp), math.ceil(hi_exp)
    if last == first:
        last += 1
    every = next(m for m in (1, 2, 3, 5, 10, 20, 50, 100, 200, 500) if (last - first) / m <= n)
    first = every * math.floor(first / every)
    return list(range(first, last + every, every)) if (last - first) % every else list(range(first, last + 1, every))


def number(v: float) -> str:
    """A tick label: the shortest plain form (``0.5``, ``12``, ``2500``), scientific beyond."""
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e5:
        return f"{v:.6g}"
    m, e = f"{v:.2e}".split("e")
    m = m.rstrip("0").rstrip(".")
    return f"{m}e{int(e)}"


def decade(e: int) -> str:
    """The label of ``10**e``: ``0.01`` .. ``10000`` in plain digits, ``10`` with a superscript
    exponent beyond."""
    if -3 <= e <= 4:
        return number(10.0 ** e)
    return f'10<tspan dy="-5" font-size="9">{e}</tspan>'


def loss_chart(history: Sequence[tuple[int, float]], events: Sequence[Event], lo: int, hi: int) -> str:
    """The loss curve (log scale when it spans more than two decades), non-finite losses as
    red crosses on the top edge, and one marker per event at its onset, coloured by kind."""
    h, top, bottom = 270.0, 16.0, 230.0
    sx = StepScale(lo, hi)
    finite = [(s, v) for s, v in history if math.isfinite(v)]
    vals = [v for _, v in finite]
    log = bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 100
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    if log:
        ticks = [float(e) for e in decade_ticks(min(map(f, vals)), max(map(f, vals)))]
        labels = [decade(int(e)) for e in ticks]
    else:
        ticks = nice_ticks(min(vals), max(vals), 5) if vals else [0.0, 0.5, 1.0]
        labels = [number(t) for t in ticks]
    ymin, ymax = ticks[0], ticks[-1]

    def sy(v: float) -> float:
        return bottom - (f(v) - ymin) / (ymax - ymin) * (bottom - top - 10)

    body = _axis(sx, bottom)
    for yv, text in zip(ticks, labels):
        y = bottom - (yv - ymin) / (ymax - ymin) * (bottom - top - 10)
        body.append(f'<line x1="{LEFT}" y1="{_fmt(y)}" x2="{WIDTH - RIGHT}" y2="{_fmt(y)}" stroke="#eee"/>'
                    f'<text x="{LEFT - 6}" y="{_fmt(y + 4)}" text-anchor="end" class="tick">{text}</text>')
    body.append(f'<text x="8" y="{_fmt(top + 4)}" class="tick">loss{" (log)" if log else ""}</text>')
    for e in events:
        x = sx(e.step + 0.5)
        tip = escape(str(e))
        body.append(f'<g class="event-mark" data-kind="{escape(e.kind)}"><title>{tip}</title>'
                    f'<line x1="{_fmt(x)}" y1="{top}" x2="{_fmt(x)}" y2="{bottom}" stroke="{color(e.kind)}" '
                    f'stroke-dasharray="3 3" stroke-width="1.2"/>'
                    f'<path d="M{_fmt(x - 5)} {top - 10} L{_fmt(x + 5)} {top - 10} L{_fmt(x)} {top} Z" '
                    f'fill="{color(e.kind)}"/></g>')
    if finite:
        pts = " ".join(f"{_fmt(sx(s + 0.5))},{_fmt(sy(v))}" for s, v in finite)
        body.append(f'<polyline class="loss-line" points="{pts}" fill="none" stroke="#1f3b73" stroke-width="1.6"/>')
    for s, v in history:
        if not math.isfinite(v):
            x = sx(s + 0.5)
            body.append(f'<text class="nonfinite" x="{_fmt(x)}" y="{top + 8}" text-anchor="middle" fill="#d62728">'
                        f'×<title>loss {v} at step {s}</title></text>')
    return _svg(h, body, "loss curve with events")


def probability_chart(series: Sequence[tuple[str, str, Sequence[tuple[int, float]]]], lo: int, hi: int) -> str:
    """Lines in 0..1 over steps: ``(label, colour, [(step, p), ...])`` each."""
    h, top, bottom = 190.0, 10.0, 150.0
    sx = StepScale(lo, hi)
    body = _axis(sx, bottom)
    for p in (0.0, 0.5, 1.0):
        y = bottom - p * (bottom - top)
        body.append(f'<line x1="{LEFT}" y1="{_fmt(y)}" x2="{WIDTH - RIGHT}" y2="{_fmt(y)}" stroke="#eee"/>'
                    f'<text x="{LEFT - 6}" y="{_fmt(y + 4)}" text-anchor="end" class="tick">{p:.1f}</text>')
    for i, (label, col, pts) in enumerate(series):
        if not pts:
            continue
        line = " ".join(f"{_fmt(sx(s + 0.5))},{_fmt(bottom - p * (bottom - top))}" for s, p in pts)
        body.append(f'<polyline points="{line}" fill="none" stroke="{col}" stroke-width="1.8">'
                    f'<title>{escape(label)}</title></polyline>')
        body.append(f'<rect x="{8}" y="{_fmt(top + 14 * i)}" width="10" height="10" fill="{col}"/>'
                    f'<text x="22" y="{_fmt(top + 9 + 14 * i)}" class="tick">{escape(label[:26])}</text>')
    return _svg(h, body, "posterior over steps")


def event_map(events: Sequence[Event], layers: Sequence[str], lo: int, hi: int,
              propagation: Sequence[Sequence[tuple[str | None, int]]] = (), types: dict[str, str] | None = None) -> str:
    """Layers (rows, forward order, loss events on a last ``loss`` row) by steps; each event is
    a bar from its onset to its end, one lane per kind in a row. ``propagation`` lists, per
    kind, ``(layer, first step)`` in order of appearance, drawn as a line linking the onsets;
    ``types`` (layer -> module class) goes into the row labels' tooltips."""
    rows = list(layers) + (["(loss)"] if any(e.layer is None for e in events) else [])
    lanes: dict[str, list[str]] = {r: [] for r in rows}
    for e in events:
        row = "(loss)" if e.layer is None else e.layer
        if row in lanes and e.kind not in lanes[row]:
            lanes[row].append(e.kind)
    row_h = {r: 14.0 * max(1, len(k)) + 4 for r, k in lanes.items()}
    y_of, y = {}, 8.0
    for r in rows:
        y_of[r] = y
        y += row_h[r]
    sx = StepScale(lo, hi)
    body = []
    for r in rows:
        y0 = y_of[r]
        body.append(f'<text x="{LEFT - 6}" y="{_fmt(y0 + row_h[r] / 2 + 4)}" text-anchor="end" class="layer">'
                    f'{escape(r if len(r) <= 22 else "…" + r[-21:])}<title>{escape(r)}'
                    f'{escape(f" ({types[r]})") if types and r in types else ""}</title></text>'
                    f'<line x1="{LEFT}" y1="{_fmt(y0 + row_h[r])}" x2="{WIDTH - RIGHT}" y2="{_fmt(y0 + row_h[r])}" '
                    f'stroke="#f0f0f0"/>')
    for e in events:
        row = "(loss)" if e.layer is None else e.layer
        if row not in y_of:
            continue
        lane = lanes[row].index(e.kind)
        x0, x1 = sx(e.step), sx(e.end_step + 1)
        body.append(f'<rect class="event-cell" data-kind="{escape(e.kind)}" x="{_fmt(x0)}" '
                    f'y="{_fmt(y_of[row] + 2 + 14 * lane)}" width="{_fmt(max(2.0, x1 - x0))}" height="12" '
                    f'fill="{color(e.kind)}" opacity="0.85"><title>{escape(str(e))}</title></rect>')
    for order in propagation:
        pts = [(sx(s + 0.5), y_of[r if r is not None else "(loss)"] + row_h[r if r is not None else "(loss)"] / 2)
               for r, s in order if (r if r is not None else "(loss)") in y_of]
        if len(pts) > 1:
            # drawn over the cells, dark and wide enough to read at half scale (a narrow screen),
            # with a dot on each onset it links
            line = " ".join(f"{_fmt(a)},{_fmt(b)}" for a, b in pts)
            body.append(f'<polyline class="propagation-halo" points="{line}" fill="none" stroke="#fff" '
                        f'stroke-width="5" stroke-opacity="0.8"/>'
                        f'<polyline class="propagation" points="{line}" fill="none" stroke="#111" '
                        f'stroke-width="2.2" stroke-dasharray="7 4"/>'
                        + "".join(f'<circle cx="{_fmt(a)}" cy="{_fmt(b)}" r="3.5" fill="#111"/>' for a, b in pts))
    body += _axis(sx, y + 2)
    return _svg(y + 34, body, "layer by step map of events")


def bars(rows: Sequence[tuple[str, float, bool]]) -> str:
    """Horizontal probability bars: ``(label, p, highlighted)`` each."""
    h = 22.0 * len(rows) + 10
    x0, x1 = 230.0, WIDTH - 90.0
    body = []
    for i, (label, p, hot) in enumerate(rows):
        y = 6 + 22 * i
        col = "#e45756" if hot else "#8aa4c8"
        body.append(f'<text x="{x0 - 8}" y="{_fmt(y + 13)}" text-anchor="end" class="layer">{escape(label)}</text>'
                    f'<rect x="{x0}" y="{_fmt(y)}" width="{_fmt(x1 - x0)}" height="16" fill="#f3f3f3"/>'
                    f'<rect class="bar" x="{x0}" y="{_fmt(y)}" width="{_fmt(max(0.0, min(1.0, p)) * (x1 - x0))}" '
                    f'height="16" fill="{col}"/>'
                    f'<text x="{_fmt(x1 + 6)}" y="{_fmt(y + 13)}" class="tick">{probability(p)}</text>')
    return _svg(h, body, "posterior probabilities")


def legend(kinds: Iterable[str], per_row: int = 8) -> str:
    """Colour swatches for ``kinds``, ``per_row`` to a row."""
    kinds = list(kinds)
    body = []
    for i, k in enumerate(kinds):
        x, y = 10 + 110 * (i % per_row), 4 + 20 * (i // per_row)
        body.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{color(k)}"/>'
                    f'<text x="{x + 17}" y="{y + 10}" class="tick">{escape(k)}</text>')
    return _svg(22.0 + 20 * ((max(1, len(kinds)) - 1) // per_row), body, "event kinds")
