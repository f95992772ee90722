"""The HTML report: one self-contained page per run (``neuraldbg report``, ``dbg.report``).

The page is plain HTML with inline CSS and inline SVG (:mod:`neuraldbg.report.svg`): no
script, no font, no image and no address outside the file, so it opens offline and can be
attached to a bug report. It reads only stored results (a trace and the causal engine's
answers about it), never the model. Sections, each a ``<section id=...>``: ``summary``,
``loss`` (the loss curve with events marked), ``timeline`` (the posterior as of each checked
step), ``event-map`` (layers in forward order by steps, one facet per rank for a merged
distributed session), ``posterior`` (bars, ``P(healthy)`` first), ``hypotheses`` (ranked, with
evidence and fix), ``chain`` (the causal chain of each failure type that occurred) and
``not-observed`` (the evidence variables the diagnosis did not see, by reason, and the monitor's
internal errors: :mod:`neuraldbg.report.coverage`). When nothing was observed the summary shows a
banner saying there is no diagnosis instead of a verdict: the posterior is then the prior. The
summary also says in one line which steps the monitor checked (the trace's cadence).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from html import escape
from typing import Any

from neuraldbg.causal.nodes.run import MERGED_RANKS
from neuraldbg.events.base import Event
from neuraldbg.events.compress import compress
from neuraldbg.jsonio import write_text_atomic
from neuraldbg.report.cadence import describe as describe_cadence
from neuraldbg.report import coverage as coverage_text
from neuraldbg.report import resolve_source, svg
from neuraldbg.report.timeline import posterior_timeline
from neuraldbg.trace import Trace
from neuraldbg.vocab import ALL_EVENT_KINDS, FAILURE_TYPES

#: section ids, in page order (tests and links rely on them)
SECTIONS = ("summary", "loss", "timeline", "event-map", "posterior", "hypotheses", "chain", "not-observed")
#: evidence events listed under each hypothesis before eliding the rest
MAX_EVIDENCE = 8
#: steps at which the report evaluates the posterior timeline
TIMELINE_POINTS = 120

#: the page's only styles. Responsive: charts are laid out at the page's width, never scaled,
#: so their text stays at 11 px (:mod:`neuraldbg.report.svg`); a label too long for a phone has a
#: short variant shown below 600 px (``wide-only`` / ``narrow-only``); legends and long names
#: wrap; a table wider than the screen, or anything a chart could not fit, scrolls in its own
#: box: the page itself never scrolls sideways, from a phone (320 px) up.
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:960px;color:#222;
padding:0 12px;overflow-wrap:anywhere}
svg{display:block;overflow:visible}.scroll,.plot,.bars{overflow-x:auto;max-width:100%}
.plot{padding:0 RIGHTpx 0 LEFTpx}.bars{max-width:640px}.narrow-only{display:none}
@media (max-width:BELOWpx){.wide-only{display:none}.narrow-only{display:inline}ol.hyps{padding-left:22px}}
.legend{display:flex;flex-wrap:wrap;gap:2px 16px;list-style:none;padding:0;margin:4px 0 8px;font-size:12px}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f1f1f1;padding:0 3px;
border-radius:3px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
h3{font-size:14px;margin:14px 0 4px}.muted{color:#666}.muted a{color:inherit}.big{font-size:30px;font-weight:600}
.ok{color:#2e7d32}.bad{color:#c62828}svg text{font:11px system-ui,sans-serif;fill:#333}
svg .layer,svg .layer-short{font-size:11px;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
ol.hyps>li{margin:0 0 14px}.fix{background:#f4f8ec;padding:4px 8px;border-radius:4px}
table{border-collapse:collapse;font-size:12px;margin-top:4px}td,th{border-bottom:1px solid #eee;padding:2px 6px;
text-align:left;white-space:nowrap}td.where{white-space:normal;overflow-wrap:normal;min-width:9em}
.chain{display:flex;flex-wrap:wrap;align-items:center;gap:4px;margin:6px 0 12px}
.node{border:1px solid #bbb;border-radius:4px;padding:3px 8px;background:#fafafa;font-size:12px}
.node.root{background:#fdecea;border-color:#e45756;font-weight:600}.arrow{color:#888}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.banner{background:#fff4e5;border-left:4px solid #ef8f00;padding:8px 12px;border-radius:4px;font-size:16px}
.warn{color:#a15c00}ul.unobs{padding-left:20px;margin:4px 0}ul.unobs>li{margin:0 0 4px}
""".replace("RIGHT", str(svg.RIGHT)).replace("LEFT", str(svg.LEFT)).replace("BELOW", f"{svg.BREAKPOINT - 0.02:g}")


@dataclass(frozen=True)
class ReportData:
    """What the page shows, computed once from a trace (plain values and engine records)."""

    trace: Trace
    posterior: Any
    hypotheses: tuple
    chains: tuple
    timeline: tuple
    ranks: tuple[int, ...]
    #: what the diagnosis observed (:class:`~neuraldbg.causal.types.Coverage`); None: not asked
    coverage: Any = None


def collect(source: Any, priors: Any = None, timeline_points: int = TIMELINE_POINTS) -> ReportData:
    """Ask the causal engine everything the report shows about ``source``."""
    from neuraldbg.causal import api
    from neuraldbg.causal.hypotheses import failure_observed

    trace, priors = resolve_source(source, priors)
    pri = api.resolve_priors(trace, priors)
    ev = api.evidence(trace)
    chains = tuple(api.causal_chain(trace, ft, pri) for ft in FAILURE_TYPES if failure_observed(trace, ev, ft))
    ranks = set(trace.signatures.value(MERGED_RANKS, ()) or ()) | {e.rank for e in trace.events if e.rank is not None}
    return ReportData(trace=trace, posterior=api.posterior(trace, pri), hypotheses=tuple(api.hypotheses(trace, pri)),
                      chains=chains, timeline=tuple(posterior_timeline(trace, pri, max_points=timeline_points)),
                      ranks=tuple(sorted(int(r) for r in ranks)), coverage=api.coverage(trace))


_CODE = re.compile(r"`([^`<>]+)`")


def rich(text: str) -> str:
    """``text`` escaped for HTML, with the Markdown-style ```name``` spans of the engine's
    sentences (layer names, in the hypotheses and fixes) set as ``<code>``."""
    return _CODE.sub(r"<code>\1</code>", escape(text))


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{escape(title)}</h2>{body}</section>'


def _where(e: Event) -> str:
    return "loss" if e.layer is None else e.layer


def _seen(d: ReportData) -> str:
    """The summary's line on coverage: how many variables were not observed, internal errors."""
    cov = d.coverage
    if cov is None:
        return ""
    missing = len(cov.unobserved())
    parts = []
    if missing:
        parts.append(f'<a href="#not-observed">{missing} of {len(cov)} evidence variables not observed</a>'
                     + (f" ({len(cov.gaps())} missed by the monitor)" if cov.gaps() else ""))
    if cov.internal_errors:
        parts.append(f'<span class="warn">{escape(coverage_text.errors_sentence(cov.internal_errors))}</span>')
    return f"<p class=\"muted\">{'; '.join(parts)}</p>" if parts else ""


def _summary(d: ReportData) -> str:
    t, p = d.trace, d.posterior.p_healthy
    ranks = f", ranks {', '.join(map(str, d.ranks))} merged" if d.ranks else ""
    facts = (f'<p class="muted">family {escape(t.family)}, steps {t.first_step}-{t.last_step}, {len(t.events)} '
             f'events, {len(t.layers)} monitored layers{escape(ranks)}; posterior from '
             f'{escape(str(d.posterior.source))}</p>')
    cadence = describe_cadence(t.cadence)  # which steps were checked, one line
    if cadence:
        facts += f'<p class="muted cadence">{escape(cadence)}</p>'
    if d.posterior.nothing_observed:  # no verdict: the number would be the prior's, not a finding
        return _section("summary", "Summary", (
            f'<p class="banner"><b>Nothing was observed: no diagnosis.</b> The monitor recorded no loss and no layer '
            f'statistics, so the posterior below is the prior (P(healthy) = {svg.probability(p)} before seeing '
            f'anything) and says nothing about this run.</p>' + _seen(d) + facts))
    if d.posterior.is_healthy:  # the one verdict (docs/api.md): P(healthy) >= 0.5
        verdict = '<span class="ok">no failure found</span>' + (
            " (the hypotheses below are weaker leads)" if d.hypotheses else "")
    elif d.hypotheses:
        verdict = f'<span class="bad">{rich(d.hypotheses[0].description)}</span>'
    else:
        verdict = '<span class="bad">something is off, but no single cause reaches the reporting floor</span>'
    return _section("summary", "Summary", (
        f'<p class="big">P(healthy) = {svg.probability(p)}</p><p>{verdict}</p>' + _seen(d) + facts))


def _kinds(events) -> list[str]:
    present = {e.kind for e in events}
    return [k for k in ALL_EVENT_KINDS if k in present]


def _loss(d: ReportData) -> str:
    t = d.trace
    body = svg.loss_chart(t.loss.history, t.events, t.first_step, t.last_step)
    if t.events:
        body += svg.legend(_kinds(t.events))
    note = (f'<p class="muted">{t.loss.n} losses recorded ({len(t.loss.history)} drawn), '
            f'{t.loss.n_nonfinite} non-finite{" (red on the top edge)" if t.loss.n_nonfinite else ""}; '
            f'dashed lines mark event onsets.</p>')
    return _section("loss", "Loss curve and events", body + note)


def _timeline(d: ReportData) -> str:
    t = d.trace
    series = [("P(healthy)", "#2e7d32", [(pt.step, pt.p_healthy) for pt in d.timeline])]
    palette = ("#e45756", "#4c78a8", "#f58518")
    for h, col in zip(d.hypotheses[:3], palette):
        series.append((f"{h.cause} = {h.state}", col, [(pt.step, pt.probability(h.cause, h.state))
                                                       for pt in d.timeline]))
    return _section("timeline", "Diagnosis over the run",
                    svg.legend_html((name, col) for name, col, _ in series)
                    + svg.probability_chart(series, t.first_step, t.last_step)
                    + '<p class="muted">The posterior as of each checked step, from the events seen up to it.</p>')


def _facet(events, trace: Trace) -> str:
    names = {e.layer for e in events if e.layer is not None}
    layers = [li.name for li in sorted(trace.layers, key=lambda li: li.index) if li.name in names]
    layers += sorted(n for n in names if n not in set(layers))  # layers the trace does not list
    props = [(p.kind, p.order) for p in compress(events, trace.layer_index)]
    return svg.event_map(events, layers, trace.first_step, trace.last_step, props,
                         types={li.name: li.type for li in trace.layers})


def _event_map(d: ReportData) -> str:
    t = d.trace
    if not t.events:
        return _section("event-map", "Events by layer and step", "<p>No events: nothing to map.</p>")
    facets = [("", list(t.events))]
    if d.ranks:
        facets = [("all ranks (seen on every rank)", [e for e in t.events if e.rank is None])]
        facets += [(f"rank {r} only", [e for e in t.events if e.rank == r]) for r in d.ranks]
    body = []
    for title, evs in facets:
        if title:
            body.append(f'<h3 class="facet">{escape(title)}</h3>')
        body.append(_facet(evs, t) if evs else '<p class="muted">no events</p>')
    shown = len({e.layer for e in t.events if e.layer is not None})
    note = (f'<p class="muted">Rows: the {shown} of {len(t.layers)} monitored layers with events, input side '
            f'first; dashed lines link the first onset of a kind in each layer (dots), in order: the propagation.</p>')
    return _section("event-map", "Events by layer and step", svg.legend(_kinds(t.events)) + "".join(body) + note)


def _posterior(d: ReportData) -> str:
    post = d.posterior
    rows = [("P(healthy)", post.p_healthy, False)]
    top = {(h.cause, h.state) for h in d.hypotheses}
    for var, dist in post.items():
        if var == "healthy":
            continue
        rows += [(f"{var} = {state}", p, (var, state) in top) for state, p in dist.items()]
    if post.nothing_observed:
        return _section("posterior", "Prior (nothing observed)", svg.bars(rows) + (
            '<p class="muted">Nothing was observed, so these are the prior probabilities, not a finding.</p>'))
    return _section("posterior", "Posterior", svg.bars(rows))


def span_text(step: int, end_step: int | None = None) -> str:
    """An event's steps as the table writes them: ``step 7`` for one step, ``steps 7-12``."""
    return f"step {step}" if end_step is None or end_step == step else f"steps {step}-{end_step}"


def significant(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits as HTML (trailing zeros dropped), never rounded
    to a misleading 0: plain digits from 0.001 to 10^6 (``0.00715``, ``1230``, ``6``), a power
    of ten beyond (``4.34×10<sup>−6</sup>``); ``0`` only for zero itself."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else escape(str(x))

    def trim(text: str) -> str:  # 6.00 -> 6, 0.0120 -> 0.012: the digits that carry information
        return text.rstrip("0").rstrip(".") if "." in text else text

    mantissa, exp = f"{x:.{digits - 1}e}".split("e")
    e = int(exp)
    if -3 <= e < 6:
        return trim(f"{float(mantissa) * 10.0 ** e:.{max(0, digits - 1 - e)}f}").replace("-", "−")
    return f"{trim(mantissa)}×10<sup>{e}</sup>".replace("-", "−")


def _breakable(name: str) -> str:
    """A dotted layer name, escaped, that may wrap after each dot (a table cell on a phone)."""
    return "<wbr>".join(escape(part) for part in re.split(r"(?<=\.)", name))


def _measured(e: Event) -> str:
    """The values that triggered an event, as its severity cell's tooltip."""
    return ", ".join(f"{k} {v:.4g}" for k, v in e.values)


def _event_table(events) -> str:
    ranked = any(e.rank is not None for e in events)  # the rank column only for distributed runs
    rows = "".join(f"<tr><td><span class='swatch' style='background:{svg.color(e.kind)}'></span>{escape(e.kind)}"
                   f"</td><td class='where'>{_breakable(_where(e))}</td><td>{span_text(e.step, e.end_step)}</td>"
                   f"<td>{e.count}</td>"
                   + (f"<td>{'all' if e.rank is None else e.rank}</td>" if ranked else "")
                   + (f"<td title='{escape(_measured(e))}'>" if e.values else "<td>")
                   + f"{significant(e.severity)}</td></tr>"
                   for e in events[:MAX_EVIDENCE])
    more = (f"<tr><td colspan=6 class='muted'>... {len(events) - MAX_EVIDENCE} more events</td></tr>"
            if len(events) > MAX_EVIDENCE else "")
    return ("<div class='scroll'><table><tr><th>kind</th><th>where</th><th>steps</th><th>count</th>"
            + ("<th>rank</th>" if ranked else "") + "<th>severity</th></tr>" + rows + more + "</table></div>")


def _hypotheses(d: ReportData) -> str:
    if d.posterior.nothing_observed:
        return _section("hypotheses", "Hypotheses", "<p>No hypothesis: nothing was observed to diagnose.</p>")
    if not d.hypotheses:
        return _section("hypotheses", "Hypotheses", "<p>No hypothesis above the reporting floor.</p>")
    items = []
    for h in d.hypotheses:
        items.append(f"<li><b>{escape(h.cause)} = {escape(h.state)}</b> (p = {svg.probability(h.probability)})"
                     f"<br>{rich(h.description)}<p class='fix'>Fix: {rich(h.suggested_fix)}</p>"
                     f"{_event_table(list(h.evidence)) if h.evidence else ''}</li>")
    return _section("hypotheses", "Hypotheses", "<ol class='hyps'>" + "".join(items) + "</ol>")


def _chain(d: ReportData) -> str:
    if not d.chains:
        return _section("chain", "Causal chain", "<p>No failure occurred: no chain to trace.</p>")
    parts = []
    for c in d.chains:
        parts.append(f"<h3>{escape(c.failure_type)}</h3>")
        if c.empty:
            parts.append(f"<p class='muted'>{escape(c.reason)}</p>")
            continue
        head = (f"{c.cause} = {c.state} (p = {svg.probability(c.probability)})" if c.cause else "unexplained")
        nodes = [f"<span class='node root'>{escape(head)}</span>"]
        evs = c.events
        nodes += [f"<span class='node'><span class='swatch' style='background:{svg.color(e.kind)}'></span>"
                  f"{escape(e.kind)} in {escape(_where(e))} at step {e.step}"
                  f"{'' if e.rank is None else f' [rank {e.rank}]'}</span>" for e in evs[:12]]
        if len(evs) > 12:
            nodes.append(f"<span class='node muted'>... {len(evs) - 12} more</span>")
        parts.append("<div class='chain'>" + "<span class='arrow'>&rarr;</span>".join(nodes) + "</div>")
    return _section("chain", "Causal chain", "".join(parts))


def _not_observed(d: ReportData) -> str:
    """The evidence variables the diagnosis did not see, grouped by reason: the monitor's gaps
    first, then what the run could not show; and the monitor's internal errors."""
    cov = d.coverage
    if cov is None:
        return _section("not-observed", "What was not observed", "<p class='muted'>Coverage not computed.</p>")
    gs = coverage_text.groups(cov)
    parts = []
    if not gs:
        parts.append(f"<p>All {len(cov)} evidence variables were observed.</p>")
    else:
        n = sum(len(g.variables) for g in gs)
        parts.append(f"<p>{'All' if n == len(cov) else n} of {len(cov)} evidence variables were not observed; "
                     "the diagnosis could not weigh them.</p>")
    for gap, head in ((True, coverage_text.MISSED), (False, coverage_text.NOT_SHOWN)):
        mine = [g for g in gs if g.gap == gap]
        if mine:
            items = "".join(f"<li>{', '.join(f'<code>{escape(v)}</code>' for v in g.variables)}: "
                            f"{escape(g.reason)}</li>" for g in mine)
            parts.append(f"<h3>{escape(head[0].upper() + head[1:])}</h3><ul class='unobs'>{items}</ul>")
    if cov.internal_errors:
        parts.append(f"<p class='warn'>{escape(coverage_text.errors_sentence(cov.internal_errors))}</p>")
    return _section("not-observed", "What was not observed", "".join(parts))


def render_html(source: Any, *, priors: Any = None, title: str | None = None,
                timeline_points: int = TIMELINE_POINTS) -> str:
    """The report page of a live monitor, a (merged) session or a trace, as a string."""
    d = collect(source, priors, timeline_points)
    title = title or f"NeuralDBG report: {d.trace.family} run, steps {d.trace.first_step}-{d.trace.last_step}"
    body = "".join(f(d) for f in (_summary, _loss, _timeline, _event_map, _posterior, _hypotheses, _chain,
                                  _not_observed))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1>{body}"
            f"<p class='muted'>Written by NeuralDBG from stored results; self-contained, no network.</p>"
            f"</body></html>\n")


def write_report(source: Any, path: str | os.PathLike, *, priors: Any = None, title: str | None = None) -> str:
    """Write the report page to ``path`` atomically (parent folders created); returns the path."""
    return write_text_atomic(path, render_html(source, priors=priors, title=title))
