"""The docs' report figure is what ``make docs-figures`` (docs/figures.py) would draw today.

No browser needed: the figure's source, the HTML report of the example run, is compared with
the digest committed beside the PNG. A change to the report (a sentence, a count, a chart
element, a style) or to the example run makes the committed figure stale, and this fails.
"""
from __future__ import annotations

from docs import figures


def test_the_docs_figure_is_drawn_from_todays_report(tmp_path):
    committed = figures.committed_digest()
    assert committed is not None, f"{figures.DIGEST} is missing: make docs-figures"
    html = figures.report_example(tmp_path).read_text(encoding="utf-8")
    assert figures.source_digest(html) == committed, (
        "docs/report_example.png is stale: the report it shows has changed since it was drawn; "
        "make docs-figures")


def test_the_digest_sees_what_the_figure_shows_and_not_the_last_bits_of_a_float():
    page = ('<p class="muted"><a href="#not-observed">5 of 22 evidence variables not observed</a></p>'
            '<svg width="920"><line x1="150.0" y1="230.0"/><text x="156.2">10</text></svg>')
    digest = figures.source_digest(page)
    assert figures.source_digest(page.replace('x1="150.0"', 'x1="150.00001"')) == digest
    assert figures.source_digest(page.replace('y1="230.0"', 'y1="2.3e+02"')) == digest
    for stale in (page.replace("5 of 22", "3 of 19"), page.replace(">10<", ">20<"),
                  page.replace('width="920"', 'width="900"'), page.replace("<line", "<circle")):
        assert figures.source_digest(stale) != digest
