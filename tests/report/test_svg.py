"""The report's SVG charts: readable axis ticks, a log scale over decades, a size that scales."""
from __future__ import annotations

import math
import re

import pytest

from neuraldbg.report import svg


@pytest.mark.parametrize("lo, hi", [(1.41, 2.3), (0.02, 0.7), (0.0, 1.0), (123.0, 9870.0), (-3.2, 4.1), (5.0, 5.0)])
def test_nice_ticks_are_round_and_cover_the_range(lo, hi):
    ticks = svg.nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 8
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5))
    assert all(math.isclose(b - a, step) for a, b in zip(ticks, ticks[1:]))
    assert all(len(svg.number(t)) <= 6 for t in ticks)


def test_bad_tick_range_is_refused():
    with pytest.raises(ValueError, match="finite"):
        svg.nice_ticks(0.0, float("inf"))


def test_a_loss_over_34_decades_gets_decade_ticks():
    """Regression: an exploding run's loss axis read 1.41, 3.75e+17, 9.95e+34."""
    history = [(s, 1.41 * 10 ** (s * 34.85 / 59)) for s in range(60)]
    chart = svg.loss_chart(history, [], 0, 59)
    labels = re.findall(r'class="tick">(.*?)</text>', chart)
    assert "loss (log)" in labels
    ticks = [t for t in labels if t not in ("loss (log)", "step") and not re.fullmatch(r"\d+", t) or t in ("1", "10")]
    exps = [int(m) for m in re.findall(r"10<tspan[^>]*>(-?\d+)</tspan>", chart)]
    assert "1" in ticks and exps and exps == sorted(exps) and exps[-1] >= 35
    steps = {b - a for a, b in zip(exps, exps[1:])}
    assert len(steps) == 1 and steps.pop() in (5, 10)  # evenly spaced decades, at most ~6 ticks
    assert "e+" not in chart and "3.75" not in chart


def test_a_linear_loss_axis_has_round_ticks():
    history = [(s, 2.3 - 0.015 * s) for s in range(60)]
    chart = svg.loss_chart(history, [], 0, 59)
    y_labels = re.findall(r'text-anchor="end" class="tick">([0-9.]+)</text>', chart)
    assert y_labels == ["1.4", "1.6", "1.8", "2", "2.2", "2.4"]


def test_charts_scale_with_the_viewbox():
    chart = svg.bars([("P(healthy)", 0.5, False)])
    assert f'viewBox="0 0 {svg.WIDTH} ' in chart and 'preserveAspectRatio="xMinYMin meet"' in chart
