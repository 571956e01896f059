"""The report's SVG charts: round ticks over the range, escaped text, lines broken at gaps
(the report in Chromium: tests/integration/test_report_html.py)."""

from __future__ import annotations

from acceptrun.report.svg import Mark, Series, line_chart, nice_ticks


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0, 1) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert nice_ticks(3.2, 97.1) == [0.0, 25.0, 50.0, 75.0, 100.0]
    ticks = nice_ticks(5.0, 5.0)
    assert ticks[0] < 5.0 < ticks[-1]


def test_line_chart_escapes_text_and_breaks_lines_at_gaps() -> None:
    svg = line_chart(
        [Series("a<b>", [(0, 1), (1, 2), (2, float("nan")), (3, 1), (4, 0.5)])],
        title='loss "&" <x>',
        x_label="step",
        y_label="loss",
        marks=[Mark(2.5, "restart", "attempt <2>")],
    )
    assert "<b>" not in svg and "a&lt;b&gt;" in svg and "&quot;&amp;&quot;" in svg
    assert "attempt &lt;2&gt;" in svg
    (path,) = [p for p in svg.split("<path ")[1:]]
    assert path.count("M") == 2  # two segments: the gap is not bridged
    assert "nan" not in svg
