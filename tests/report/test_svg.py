"""The report's SVG charts: readable axis ticks in one format per axis, a log scale over decades,
labels that fit the width they have, charts laid out at the page's width rather than scaled."""
from __future__ import annotations

import math
import re

import pytest

from neuraldbg.report import svg

#: the widths of some labels in DejaVu Sans at 11 px (what Chromium draws ``system-ui`` with on
#: a bare Linux, measured with its advance widths): the estimate may not be shorter
DEJAVU_11PX = {
    "training_loop = params_not_in_optimizer": 225.75,
    "model.encoder.layer.11.attention.self.query": 240.17,
    "model.encoder.layer.11.attention.output.dense": 259.28,
    "learning_rate = too_high": 136.19,
    "P(healthy)": 56.56,
    "MMMMWWW": 70.56,
    "iiiilll": 21.44,
}


def tick_labels(chart: str) -> list[str]:
    """The y-axis tick labels of a chart (right-aligned in the gutter), tags stripped."""
    return [re.sub(r"<[^>]+>", "", m) for m in re.findall(r'text-anchor="end" class="tick">(.*?)</text>', chart)
            if "step" not in m]


@pytest.mark.parametrize("lo, hi", [(1.41, 2.3), (0.02, 0.7), (0.0, 1.0), (123.0, 9870.0), (-3.2, 4.1), (5.0, 5.0)])
def test_nice_ticks_are_round_and_cover_the_range(lo, hi):
    ticks = svg.nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 8
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5))
    assert all(math.isclose(b - a, step) for a, b in zip(ticks, ticks[1:]))
    labels, exp = svg.linear_labels(ticks)
    assert exp == 0 and all(len(t) <= 6 for t in labels)


def test_bad_tick_range_is_refused():
    with pytest.raises(ValueError, match="finite"):
        svg.nice_ticks(0.0, float("inf"))


@pytest.mark.parametrize("ticks, labels, exp", [
    ([1.4, 1.6, 1.8, 2.0, 2.2, 2.4], ["1.4", "1.6", "1.8", "2.0", "2.2", "2.4"], 0),
    ([0.0, 0.25, 0.5], ["0.00", "0.25", "0.50"], 0),
    ([-0.2, 0.0, 0.2], ["−0.2", "0.0", "0.2"], 0),
    ([0.0, 2500.0, 5000.0], ["0", "2500", "5000"], 0),
    ([200000.0, 400000.0, 600000.0], ["2", "4", "6"], 5),
    ([1e6, 1.5e6, 2e6], ["1.0", "1.5", "2.0"], 6),
    ([0.0002, 0.0004, 0.0006], ["2", "4", "6"], -4),
])
def test_a_linear_axis_has_one_format(ticks, labels, exp):
    """Regression: an axis read 2, 2.2, 2.4 beside 1e5-style labels; now the same decimals on
    every tick, and a common power of ten for the axis title beyond 1e5 or below 1e-3."""
    assert svg.linear_labels(ticks) == (labels, exp)


@pytest.mark.parametrize("e, text", [(0, "10⁰"), (4, "10⁴"), (-4, "10⁻⁴"), (20, "10²⁰")])
def test_every_power_of_ten_reads_the_same(e, text):
    assert svg.power_text(e) == text
    label = svg.decade(e)
    assert label.startswith("10<tspan") and re.sub(r"<[^>]+>", "", label) == "10" + str(e).replace("-", "−")
    assert "font-size" not in label  # the exponent is drawn at the tick's own size (>= 11 px)


def test_a_loss_over_34_decades_gets_decade_ticks():
    """Regression: an exploding run's loss axis read 1.41, 3.75e+17, 9.95e+34."""
    history = [(s, 1.41 * 10 ** (s * 34.85 / 59)) for s in range(60)]
    chart = svg.loss_chart(history, [], 0, 59)
    assert "loss (log scale)" in chart
    exps = [int(m.replace("−", "-")) for m in re.findall(r'10<tspan class="exp" dy="-5">(−?\d+)</tspan>', chart)]
    assert exps and exps == sorted(exps) and exps[0] == 0 and exps[-1] >= 35
    steps = {b - a for a, b in zip(exps, exps[1:])}
    assert len(steps) == 1 and steps.pop() in (5, 10)  # evenly spaced decades, at most ~6 ticks
    assert "e+" not in chart and "3.75" not in chart


def test_a_log_axis_writes_every_decade_as_a_power_of_ten():
    """Regression: one log axis read 10⁸, 10⁶, 10000, 100, and 0.001 beside 10⁻⁴."""
    history = [(s, 10 ** (-4 + 12 * s / 39)) for s in range(40)]
    labels = tick_labels(svg.loss_chart(history, [], 0, 39))
    assert labels and all(re.fullmatch(r"10−?\d+", t) for t in labels), labels
    assert {"10−4", "100", "108"} <= set(labels)  # 10⁻⁴, 10⁰ and 10⁸, tags stripped


def test_a_linear_loss_axis_has_round_ticks_in_one_format():
    history = [(s, 2.3 - 0.015 * s) for s in range(60)]
    assert tick_labels(svg.loss_chart(history, [], 0, 59)) == ["1.4", "1.6", "1.8", "2.0", "2.2", "2.4"]
    big = svg.loss_chart([(s, 2e5 + 1e4 * s) for s in range(60)], [], 0, 59)
    assert "loss (×10⁵)" in big and all(re.fullmatch(r"\d+(\.\d)?", t) for t in tick_labels(big))


def test_the_width_estimate_errs_long():
    for text, px in DEJAVU_11PX.items():
        assert px <= svg.text_width(text) <= 1.25 * px, text
    assert svg.text_width("ab", 22) == pytest.approx(2 * svg.text_width("ab", 11))


@pytest.mark.parametrize("text", ["model.encoder.layer.11.attention.self.query",
                                  "training_loop = params_not_in_optimizer", "x" * 200, "P(healthy)"])
@pytest.mark.parametrize("room", [40.0, 120.0, 200.0, 296.0, 576.0])
def test_a_fitted_label_fits_and_keeps_what_it_can(text, room):
    for keep in ("end", "middle"):
        got = svg.fit_label(text, room, keep=keep)
        assert svg.text_width(got) <= room or got == "…"
        if svg.text_width(text) <= room:
            assert got == text
        else:
            assert got.count("…") == 1 and len(got) < len(text)
            if keep == "end":
                assert text.endswith(got[1:])
            else:
                head, tail = got.split("…")
                assert text.startswith(head) and text.endswith(tail)


def test_a_long_layer_name_loses_its_leading_parts_at_a_dot():
    got = svg.fit_label("model.encoder.layer.11.attention.self.query", 200)
    assert got.startswith("…") and got.endswith("attention.self.query")
    assert got[1:] in {"layer.11.attention.self.query", "11.attention.self.query", "attention.self.query"}
    with pytest.raises(ValueError, match="keep"):
        svg.fit_label("x" * 100, 50, keep="start")


def test_a_label_has_a_narrow_variant_only_when_a_phone_needs_one():
    short = svg.label("P(healthy)", 0, 10, "layer")
    assert short.count("<text") == 1 and "only" not in short and "<title>P(healthy)</title>" in short
    name = "model.encoder.layer.11.attention.output.dense.with.a.longer.tail"
    both = svg.label(name, 0, 10, "layer")
    wide, narrow = re.findall(r"<text [^>]*>([^<]*)<title>", both)
    assert 'class="layer wide-only"' in both and 'class="layer-short narrow-only"' in both
    assert wide == name and narrow.startswith("…") and svg.text_width(narrow) <= svg.NARROW_PX
    assert both.count(f"<title>{name}</title>") == 2  # the whole name on hover, whichever is shown


def test_posterior_labels_are_never_clipped():
    """Regression: the posterior chart read "raining_loop = params_not_in_optimizer" at 1280 px,
    its first letter cut off by a fixed label column."""
    rows = [("P(healthy)", 0.0, False), ("training_loop = params_not_in_optimizer", 0.004, False),
            ("learning_rate = too_high", 1.0, True)]
    chart = svg.bars(rows)
    shown = re.findall(r'<text [^>]*class="layer[^"]*"[^>]*>([^<]*)<title>', chart)
    assert shown == [r[0] for r in rows]  # whole, on a line of their own
    assert all(svg.text_width(t) <= svg.NARROW_PX - 44 for t in shown)  # fit beside the number on a phone
    assert re.findall(r'class="tick value">([^<]*)<', chart) == ["0.00", "0.00", "1.00"]


def test_charts_are_laid_out_at_the_page_width_not_scaled():
    """Regression: 920-unit viewBoxes shrank with a phone's screen and their text to 4-5 px."""
    history = [(s, 1.0 / (s + 1)) for s in range(30)]
    for chart in (svg.bars([("P(healthy)", 0.5, False)]), svg.loss_chart(history, [], 0, 29),
                  svg.probability_chart([("P(healthy)", "#2e7d32", [(s, 0.5) for s in range(30)])], 0, 29),
                  svg.event_map([], ["fc1"], 0, 29)):
        outer = re.match(r'<div class="(plot|bars)"><svg ([^>]*)>', chart)
        assert outer and 'width="100%"' in outer.group(2) and "viewBox" not in outer.group(2)
        # a stretched inner svg holds only lines: no text is ever scaled with it
        for inner in re.findall(r'<svg [^>]*preserveAspectRatio="none"[^>]*>(.*?)</svg>', chart):
            assert "<text" not in inner


def test_legends_are_html_and_keep_whole_labels():
    """Regression: the timeline's legend drew "training_loop=stale_gradie" over the axis."""
    got = svg.legend_html([("training_loop = stale_gradients", "#e45756"), ("P(healthy)", "#2e7d32")])
    assert got.startswith('<ul class="legend">') and "training_loop = stale_gradients</li>" in got
    assert "<svg" not in got and "<svg" not in svg.legend(["exploding", "nan"])
