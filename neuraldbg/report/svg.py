"""Inline SVG charts for the HTML report: plain strings, no plotting library, no network.

The charts are drawn at the width of the page, whatever it is, and never scaled: an ``<svg>``
is ``width="100%"`` with no ``viewBox``, its user unit is the CSS pixel, so chart text is as
large on a phone as on a desktop (:data:`FONT_PX`). Positions along the step axis are
percentages of the chart's width (``x="37.5%"``); a line through data points is drawn in a
nested ``<svg>`` stretched over the plot (``preserveAspectRatio="none"``, strokes that do not
scale). Y-axis ticks sit in the left gutter of the chart's box (:data:`LEFT` px of padding,
``overflow: visible``). Labels (layer names, ``variable = state``) stand on a line of their own
above their row, fitted to the width they have (:func:`fit_label`, a generous estimate of
their width, :func:`text_width`): shortened with an ellipsis only when they would not fit,
the whole name in a ``<title>`` tooltip; never clipped. A label too long for a phone gets a
second, shorter variant that the page's CSS shows below :data:`BREAKPOINT` px instead.

Colours are fixed per event kind (:data:`KIND_COLORS`) so the loss curve, the event map and
the legend agree. Axis ticks are round numbers (:func:`nice_ticks`) in one format per axis
(:func:`linear_labels`), powers of ten on a log scale (:func:`decade_ticks`, :func:`decade`).
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

#: the size of every chart text, in CSS pixels (the page's CSS sets it; charts are never scaled)
FONT_PX = 11.0
#: the gutter left of a step chart's plot, for the y-axis ticks (CSS padding of ``.plot``)
LEFT = 48
#: the room right of a plot, for the last tick label (CSS padding of ``.plot``)
RIGHT = 14
#: below this viewport width (CSS px) the page shows the labels' narrow variants
BREAKPOINT = 600
#: the width a chart has on the narrowest screen the page is laid out for (a 320 px phone
#: less the page's 12 px margins) and at :data:`BREAKPOINT`
NARROW_PX = 320 - 24
WIDE_PX = BREAKPOINT - 24
#: height of a label line above its row
LABEL_H = 15.0
#: height of one lane (one event kind) in an event-map row
LANE_H = 14.0

# Glyph advances in em of DejaVu Sans (what ``system-ui`` and ``sans-serif`` resolve to on a
# bare Linux; the widest of the usual UI fonts), rounded up: an estimate that errs long.
_EM = {**dict.fromkeys("ijlI'", 0.30), **dict.fromkeys(".,:;|", 0.34), **dict.fromkeys(" /\\f-()[]tr!", 0.42),
       **dict.fromkeys("_szc\"`", 0.56), **dict.fromkeys("=×−+<>~^#&*", 0.86), **dict.fromkeys("mwMW…%@", 1.0)}
_EM_UPPER = 0.80
_EM_OTHER = 0.65
#: safety factor on top of the table (kerning, a wider fallback font)
_SLACK = 1.05


def probability(p: float) -> str:
    """A probability as the report writes every one: two decimals, as in the hypotheses'
    sentences (``p=0.77``)."""
    return f"{p:.2f}"


def color(kind: str) -> str:
    """The colour of an event kind (grey for a kind this palette does not know)."""
    return KIND_COLORS.get(kind, "#777777")


def _fmt(x: float) -> str:
    return f"{x:.1f}"


def _pct(x: float) -> str:
    return f"{x:.3f}%"


def text_width(text: str, px: float = FONT_PX) -> float:
    """A generous estimate of the width of ``text`` set at ``px`` CSS pixels in the page's
    sans-serif (DejaVu Sans' advances, rounded up, plus a margin): a label that fits by this
    measure fits on screen."""
    em = sum(_EM.get(c, _EM_UPPER if c.isupper() else _EM_OTHER) for c in text)
    return em * px * _SLACK


_SEPARATORS = "._/ -="


def fit_label(text: str, max_px: float, px: float = FONT_PX, keep: str = "end") -> str:
    """``text`` when it fits ``max_px`` (by :func:`text_width`), else shortened with an
    ellipsis to fit: ``keep="end"`` keeps its end (a layer name's last, most specific parts:
    ``…layer.11.attention.self.query``, cut after a separator when one is near), ``"middle"``
    its start and end. Never longer than ``max_px``; at the least the ellipsis."""
    if text_width(text, px) <= max_px:
        return text
    if keep not in ("end", "middle"):
        raise ValueError(f"keep must be 'end' or 'middle', got {keep!r}")
    ell = "…"
    if keep == "end":
        for i in range(1, len(text) + 1):
            if text_width(ell + text[i:], px) <= max_px:
                # a cut right after a separator reads better than one inside a word
                for j in range(i, min(len(text), i + 8)):
                    if text[j - 1] in _SEPARATORS and text[j:]:
                        return ell + text[j:]
                return ell + text[i:]
        return ell
    for n in range(len(text) - 1, 0, -1):
        head, tail = text[:(n + 1) // 2], text[len(text) - n // 2:] if n // 2 else ""
        cand = head + ell + tail
        if text_width(cand, px) <= max_px:
            return cand
    return ell


def label(text: str, x: float, y: float, cls: str, *, room: float = 0.0, keep: str = "end",
          tip: str | None = None) -> str:
    """A one-line label at ``(x, y)`` px with its full text (and ``tip``) as a tooltip, fitted
    to the chart's width less ``room`` px at :data:`BREAKPOINT` and up; when it does not fit a
    phone (:data:`NARROW_PX`) a shorter variant follows, which the page's CSS shows instead
    on a narrow screen (classes ``wide-only`` / ``narrow-only``)."""
    tooltip = f"<title>{escape(tip or text)}</title>"
    wide = fit_label(text, WIDE_PX - room, keep=keep)
    narrow = fit_label(text, NARROW_PX - room, keep=keep)
    at = f'x="{_fmt(x)}" y="{_fmt(y)}"'
    if narrow == wide:
        return f'<text {at} class="{cls}">{escape(wide)}{tooltip}</text>'
    return (f'<text {at} class="{cls} wide-only">{escape(wide)}{tooltip}</text>'
            f'<text {at} class="{cls}-short narrow-only">{escape(narrow)}{tooltip}</text>')


class StepScale:
    """Steps ``lo..hi`` onto percentages of a plot's width (one step is a band of width
    :attr:`band` percent)."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, max(hi, lo)
        self.band = 100.0 / (self.hi - self.lo + 1)

    def __call__(self, step: float) -> float:
        return (step - self.lo) * self.band

    def ticks(self, n: int = 6) -> list[int]:
        """About ``n`` round step values within the range (few enough that their labels do
        not touch on a phone)."""
        span = self.hi - self.lo + 1
        raw = max(1.0, span / n)
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
        first = int(math.ceil(self.lo / step) * step)
        return [int(t) for t in range(first, self.hi + 1, int(step))]


def _axis(sx: StepScale, y: float, label_text: str = "step") -> list[str]:
    out = [f'<line x1="0" y1="{_fmt(y)}" x2="100%" y2="{_fmt(y)}" stroke="#888"/>']
    for t in sx.ticks():
        x = _pct(sx(t + 0.5))
        out.append(f'<line x1="{x}" y1="{_fmt(y)}" x2="{x}" y2="{_fmt(y + 4)}" stroke="#888"/>'
                   f'<text x="{x}" y="{_fmt(y + 16)}" text-anchor="middle" class="tick">{t}</text>')
    out.append(f'<text x="100%" y="{_fmt(y + 30)}" text-anchor="end" class="tick">{escape(label_text)}</text>')
    return out


def _svg(height: float, body: Iterable[str], aria: str, cls: str = "plot") -> str:
    """A chart: an ``<svg>`` as wide as its box, ``height`` px high, in a ``<div class=cls>``
    (``plot``: a step chart, with the y-axis gutter; ``bars``: no gutter, at most 640 px)."""
    return (f'<div class="{cls}"><svg role="img" aria-label="{escape(aria)}" width="100%" height="{_fmt(height)}">'
            + "".join(body) + "</svg></div>")


def _stretched(height: float, y: float, body: Iterable[str]) -> str:
    """A nested ``<svg>`` over the plot's width, ``height`` px from ``y``: x in 0..1000 of
    the plot's width, y in px (lines through data points, whose coordinates cannot be
    percentages); strokes inside it keep their width (``vector-effect``)."""
    return (f'<svg x="0" y="{_fmt(y)}" width="100%" height="{_fmt(height)}" viewBox="0 0 1000 {_fmt(height)}" '
            f'preserveAspectRatio="none" overflow="visible">' + "".join(body) + "</svg>")


def _u(pct: float) -> str:
    """A percentage of the plot's width in the units of :func:`_stretched` (0..1000)."""
    return _fmt(pct * 10.0)


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


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def power_text(e: int) -> str:
    """``10**e`` as plain text with a superscript exponent (``10⁻⁴``; tooltips, tables)."""
    return "10" + str(e).translate(_SUPERSCRIPT)


def decade(e: int) -> str:
    """The tick label of ``10**e`` on a log axis, every one in the same form: ``10`` with a
    raised exponent (``10⁰``, ``10⁵``, ``10⁻³``; the exponent at the tick's own size)."""
    sign = "−" if e < 0 else ""
    return f'10<tspan class="exp" dy="-5">{sign}{abs(e)}</tspan>'


def linear_labels(ticks: Sequence[float]) -> tuple[list[str], int]:
    """The labels of round, evenly spaced ticks on a linear axis, all in one format: the same
    number of decimals (``1.4 1.6 1.8 2.0``), and beyond ``1e5`` or below ``1e-3`` a common
    power of ten, returned as its exponent for the axis title (``2 4 6`` and ``×10⁵``; 0:
    none)."""
    if not ticks:
        return [], 0
    big = max(abs(t) for t in ticks)
    exp = math.floor(math.log10(big)) if big and (big >= 1e5 or big < 1e-3) else 0
    vals = [t / 10.0 ** exp for t in ticks]
    steps = [abs(b - a) for a, b in zip(vals, vals[1:]) if b != a]
    step = min(steps) if steps else (abs(vals[0]) or 1.0)
    # the fewest decimals that write every tick exactly (0.25 steps need two)
    decimals = next((d for d in range(13) if all(abs(round(v, d) - v) < step * 1e-6 for v in vals)), 12)
    out = []
    for v in vals:
        text = f"{v:.{decimals}f}"
        out.append(f"{0:.{decimals}f}" if float(text) == 0 else text.replace("-", "−"))
    return out, exp


def _runs(steps: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive runs ``(first, last)`` of sorted steps (gaps of the thinned history join)."""
    out: list[list[int]] = []
    for s in steps:
        if out and s - out[-1][1] <= 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return [(a, b) for a, b in out]


def loss_chart(history: Sequence[tuple[int, float]], events: Sequence[Event], lo: int, hi: int) -> str:
    """The loss curve (log scale when it spans more than two decades), non-finite losses as
    red marks on the top edge, and one marker per event at its onset, coloured by kind."""
    h, top, bottom = 262.0, 40.0, 222.0
    sx = StepScale(lo, hi)
    finite = [(s, v) for s, v in history if math.isfinite(v)]
    vals = [v for _, v in finite]
    log = bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 100
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    title = "loss (log scale)" if log else "loss"
    if log:
        ticks = [float(e) for e in decade_ticks(min(map(f, vals)), max(map(f, vals)))]
        labels = [decade(int(e)) for e in ticks]
    else:
        ticks = nice_ticks(min(vals), max(vals), 5) if vals else [0.0, 0.5, 1.0]
        labels, exp = linear_labels(ticks)
        if exp:
            title += f" (×{power_text(exp)})"
    ymin, ymax = ticks[0], ticks[-1]

    def sy(v: float) -> float:
        return bottom - (f(v) - ymin) / (ymax - ymin) * (bottom - top)

    body = [f'<text x="{-LEFT + 2}" y="12" class="tick axis-title">{escape(title)}</text>']
    for yv, text in zip(ticks, labels):
        y = bottom - (yv - ymin) / (ymax - ymin) * (bottom - top)
        body.append(f'<line x1="0" y1="{_fmt(y)}" x2="100%" y2="{_fmt(y)}" stroke="#eee"/>'
                    f'<text x="-6" y="{_fmt(y + 4)}" text-anchor="end" class="tick">{text}</text>')
    body += _axis(sx, bottom)
    bad = sorted(s for s, v in history if not math.isfinite(v))
    for a, b in _runs(bad):
        n = sum(1 for s in bad if a <= s <= b)
        span = f"step {a}" if a == b else f"steps {a}-{b}"
        body.append(f'<rect class="nonfinite" x="{_pct(sx(a))}" y="{top - 8}" '
                    f'width="{_pct(max(0.4, sx(b + 1) - sx(a)))}" height="6" fill="#d62728">'
                    f'<title>{n} non-finite loss{"es" if n != 1 else ""} at {span}</title></rect>')
    for e in events:
        x = _pct(sx(e.step + 0.5))
        body.append(f'<g class="event-mark" data-kind="{escape(e.kind)}"><title>{escape(str(e))}</title>'
                    f'<line x1="{x}" y1="{top - 10}" x2="{x}" y2="{bottom}" stroke="{color(e.kind)}" '
                    f'stroke-dasharray="3 3" stroke-width="1.2"/>'
                    f'<circle cx="{x}" cy="{top - 16}" r="4.5" fill="{color(e.kind)}"/></g>')
    if finite:
        pts = " ".join(f"{_u(sx(s + 0.5))},{_fmt(sy(v))}" for s, v in finite)
        body.append(_stretched(h, 0.0, [f'<polyline class="loss-line" points="{pts}" fill="none" stroke="#1f3b73" '
                                        f'stroke-width="1.6" vector-effect="non-scaling-stroke"/>']))
    return _svg(h, body, "loss curve with events")


def probability_chart(series: Sequence[tuple[str, str, Sequence[tuple[int, float]]]], lo: int, hi: int) -> str:
    """Lines in 0..1 over steps: ``(label, colour, [(step, p), ...])`` each (the legend is
    the page's: :func:`legend_html`)."""
    h, top, bottom = 184.0, 10.0, 144.0
    sx = StepScale(lo, hi)
    body = []
    for p in (0.0, 0.5, 1.0):
        y = bottom - p * (bottom - top)
        body.append(f'<line x1="0" y1="{_fmt(y)}" x2="100%" y2="{_fmt(y)}" stroke="#eee"/>'
                    f'<text x="-6" y="{_fmt(y + 4)}" text-anchor="end" class="tick">{p:.1f}</text>')
    body += _axis(sx, bottom)
    lines = []
    for name, col, pts in series:
        if not pts:
            continue
        line = " ".join(f"{_u(sx(s + 0.5))},{_fmt(bottom - p * (bottom - top))}" for s, p in pts)
        lines.append(f'<polyline points="{line}" fill="none" stroke="{col}" stroke-width="1.8" '
                     f'vector-effect="non-scaling-stroke"><title>{escape(name)}</title></polyline>')
    body.append(_stretched(h, 0.0, lines))
    return _svg(h, body, "posterior over steps")


def event_map(events: Sequence[Event], layers: Sequence[str], lo: int, hi: int,
              propagation: Sequence[tuple[str, Sequence[tuple[str | None, int]]]] = (),
              types: dict[str, str] | None = None) -> str:
    """Layers (rows, forward order, loss events on a last ``loss`` row) by steps; each event is
    a bar from its onset to its end, one lane per kind in a row, under the row's label (the
    layer's name, on a line of its own). ``propagation`` lists, per kind, ``(kind, [(layer,
    first step), ...])`` in order of appearance, drawn as a line linking the onsets; ``types``
    (layer -> module class) goes into the row labels' tooltips."""
    rows = list(layers) + (["(loss)"] if any(e.layer is None for e in events) else [])
    lanes: dict[str, list[str]] = {r: [] for r in rows}
    for e in events:
        row = "(loss)" if e.layer is None else e.layer
        if row in lanes and e.kind not in lanes[row]:
            lanes[row].append(e.kind)
    row_h = {r: LABEL_H + LANE_H * max(1, len(k)) + 5 for r, k in lanes.items()}
    y_of, y = {}, 4.0
    for r in rows:
        y_of[r] = y
        y += row_h[r]
    sx = StepScale(lo, hi)
    body = [f'<line x1="{-LEFT + 2}" y1="{_fmt(y_of[r] + row_h[r] - 1)}" x2="100%" '
            f'y2="{_fmt(y_of[r] + row_h[r] - 1)}" stroke="#eee"/>' for r in rows]

    def lane_y(row: str, kind: str) -> float:
        return y_of[row] + LABEL_H + LANE_H * (lanes[row].index(kind) if kind in lanes[row] else 0)

    for e in events:
        row = "(loss)" if e.layer is None else e.layer
        if row not in y_of:
            continue
        x0, x1 = sx(e.step), sx(e.end_step + 1)
        body.append(f'<rect class="event-cell" data-kind="{escape(e.kind)}" x="{_pct(x0)}" '
                    f'y="{_fmt(lane_y(row, e.kind) + 1)}" width="{_pct(max(0.4, x1 - x0))}" height="12" '
                    f'fill="{color(e.kind)}" opacity="0.85"><title>{escape(str(e))}</title></rect>')
    for kind, order in propagation:
        pts = [(sx(s + 0.5), lane_y(row, kind) + 7) for row, s in
               ((r if r is not None else "(loss)", s) for r, s in order) if row in y_of]
        if len(pts) > 1:
            # drawn over the cells, dark, with a white halo and a dot on each onset it links
            line = " ".join(f"{_u(a)},{_fmt(b)}" for a, b in pts)
            body.append(_stretched(y, 0.0, [
                f'<polyline class="propagation-halo" points="{line}" fill="none" stroke="#fff" stroke-width="5" '
                f'stroke-opacity="0.8" vector-effect="non-scaling-stroke"/>',
                f'<polyline class="propagation" points="{line}" fill="none" stroke="#111" stroke-width="2.2" '
                f'stroke-dasharray="7 4" vector-effect="non-scaling-stroke"/>'])
                + "".join(f'<circle cx="{_pct(a)}" cy="{_fmt(b)}" r="3.5" fill="#111"/>' for a, b in pts))
    for r in rows:
        # the label spans the gutter and the plot (the chart's whole width less the margins),
        # drawn last, with a white halo: a propagation line passes behind it
        tip = r + (f" ({types[r]})" if types and r in types else "")
        body.append(label(r, -LEFT + 2, y_of[r] + 11, "layer", room=8, tip=tip))
    body += _axis(sx, y + 2)
    return _svg(y + 36, body, "layer by step map of events")


def bars(rows: Sequence[tuple[str, float, bool]]) -> str:
    """Horizontal probability bars: ``(label, p, highlighted)`` each, the label and the number
    on a line above the bar, which spans the chart's width."""
    step = LABEL_H + 17.0  # the label, its bar (10 px), a gap that sets the row apart from the next
    body = []
    for i, (name, p, hot) in enumerate(rows):
        y = 4 + step * i
        col = "#e45756" if hot else "#8aa4c8"
        body.append(label(name, 0, y + 11, "layer", room=44, keep="middle")
                    + f'<text x="100%" y="{_fmt(y + 11)}" text-anchor="end" class="tick value">{probability(p)}</text>'
                    f'<rect x="0" y="{_fmt(y + LABEL_H)}" width="100%" height="10" fill="#f3f3f3"/>'
                    f'<rect class="bar" x="0" y="{_fmt(y + LABEL_H)}" width="{_pct(max(0.0, min(1.0, p)) * 100)}" '
                    f'height="10" fill="{col}"/>')
    return _svg(step * len(rows), body, "posterior probabilities", cls="bars")


def legend_html(items: Iterable[tuple[str, str]]) -> str:
    """A legend as HTML, ``(label, colour)`` each: a swatch and the whole label, wrapping onto
    as many lines as the screen needs (it never overlaps a chart)."""
    return ('<ul class="legend">' + "".join(
        f"<li><span class='swatch' style='background:{escape(col)}'></span>{escape(text)}</li>"
        for text, col in items) + "</ul>")


def legend(kinds: Iterable[str]) -> str:
    """The event kinds' colours (:func:`legend_html`)."""
    return legend_html((k, color(k)) for k in kinds)
