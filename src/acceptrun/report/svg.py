"""Small, dependency-free SVG charts for the HTML report: line charts and stacked bars.

Every chart is one ``<svg>`` string with its own axes, ticks, labels and legend, so the
report stays a single file that renders with no network and no JavaScript. Text is
escaped here; callers pass plain strings.

>>> svg = line_chart([Series("loss", [(0, 2.3), (100, 1.1)])], title="Loss",
...                  x_label="step", y_label="loss", marks=[Mark(50, "checkpoint", "step 50")])
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from acceptrun.record.glossary import colour, label

__all__ = ["PALETTE", "Mark", "Series", "line_chart", "nice_ticks", "stacked_bar"]

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4b5563")
MARK_COLORS = {
    "restart": "#dc2626",
    "attempt_exit": "#dc2626",
    "checkpoint": "#059669",
    "attempt_start": "#6b7280",
    "idle": "#d97706",
}
MAX_POINTS = 1500  # per series: more points add bytes, not information, at this width


@dataclass(frozen=True, slots=True)
class Series:
    """One line: a name for the legend and (x, y) points; None gaps are skipped."""

    name: str
    points: Sequence[tuple[float, float]]
    color: str | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """A vertical marker at ``x``: a restart, a checkpoint, an attempt boundary."""

    x: float
    kind: str
    label: str = ""


@dataclass(slots=True)
class _Frame:
    width: int
    height: int
    left: int = 64
    right: int = 16
    top: int = 46
    bottom: int = 46
    x0: float = 0.0
    x1: float = 1.0
    y0: float = 0.0
    y1: float = 1.0
    parts: list[str] = field(default_factory=list)

    def px(self, x: float) -> float:
        span = self.x1 - self.x0 or 1.0
        return self.left + (x - self.x0) / span * (self.width - self.left - self.right)

    def py(self, y: float) -> float:
        span = self.y1 - self.y0 or 1.0
        return (
            self.height
            - self.bottom
            - (y - self.y0) / span * (self.height - self.top - self.bottom)
        )


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k) covering [lo, hi], about ``count`` of them."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(lo / step) * step
    ticks: list[float] = []
    value = start
    while value <= hi + step * 0.5 and len(ticks) < 50:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    a = abs(value)
    if a >= 1e9:
        return f"{value / 1e9:g}G"
    if a >= 1e6:
        return f"{value / 1e6:g}M"
    if a >= 1e4:
        return f"{value / 1e3:g}k"
    if a >= 1:
        return f"{value:.4g}"
    return f"{value:.3g}"


def _thin(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most about MAX_POINTS points; a NaN y (a gap, e.g. between attempts) is kept.

    Points are cut into buckets of consecutive points, each keeping its lowest and its
    highest point (in their order), so a spike or a stall stays drawn.
    """
    clean = [(float(x), float(y)) for x, y in points if math.isfinite(x) and not math.isinf(y)]
    if len(clean) <= MAX_POINTS:
        return clean
    size = math.ceil(len(clean) / (MAX_POINTS // 2))
    thinned: list[tuple[float, float]] = []
    for start in range(0, len(clean), size):
        bucket = clean[start : start + size]
        real = [i for i, (_x, y) in enumerate(bucket) if not math.isnan(y)]
        keep = {i for i, (_x, y) in enumerate(bucket) if math.isnan(y)}
        if real:
            keep.add(min(real, key=lambda i: bucket[i][1]))
            keep.add(max(real, key=lambda i: bucket[i][1]))
        thinned += [bucket[i] for i in sorted(keep)]
    if thinned[-1] != clean[-1]:
        thinned.append(clean[-1])
    return thinned


def _segments(points: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """Runs of points between gaps (NaN y)."""
    out: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if math.isnan(y):
            if out[-1]:
                out.append([])
        else:
            out[-1].append((x, y))
    return [seg for seg in out if seg]


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    marks: Sequence[Mark] = (),
    width: int = 760,
    height: int = 250,
    x_format: Callable[[float], str] = _fmt,
    y_format: Callable[[float], str] = _fmt,
    y_min: float | None = None,
    y_max: float | None = None,
) -> str:
    """A line chart with axes, ticks, axis labels, a legend and vertical markers."""
    lines = [(s, _thin(s.points)) for s in series]
    xs = [x for _, pts in lines for x, _ in pts] + [m.x for m in marks]
    ys = [y for _, pts in lines for _, y in pts if not math.isnan(y)]
    f = _Frame(width, height)
    if not ys:
        return _empty(title, width, "no data points")
    x_ticks = nice_ticks(min(xs), max(xs), 7)
    lo = min(ys) if y_min is None else y_min
    hi = max(ys) if y_max is None else y_max
    y_ticks = nice_ticks(lo, hi, 5)
    f.x0, f.x1 = x_ticks[0], x_ticks[-1]
    f.y0, f.y1 = y_ticks[0], y_ticks[-1]
    f.parts.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">'
    )
    f.parts.append(f"<title>{_e(title)}</title>")
    f.parts.append(f'<text x="8" y="18" class="chart-title">{_e(title)}</text>')
    _axes(f, x_ticks, y_ticks, x_format, y_format)
    _axis_labels(f, x_label, y_label)
    _marks(f, marks)
    _lines(f, lines)
    _legend(f, series, marks)
    f.parts.append("</svg>")
    return "".join(f.parts)


def _axes(
    f: _Frame,
    x_ticks: Sequence[float],
    y_ticks: Sequence[float],
    x_format: Callable[[float], str],
    y_format: Callable[[float], str],
) -> None:
    """The grid lines and tick labels of both axes, and the axes themselves."""
    p, width, height = f.parts, f.width, f.height
    for t in y_ticks:
        y = f.py(t)
        p.append(
            f'<line x1="{f.left}" y1="{y:.1f}" x2="{width - f.right}" y2="{y:.1f}" class="grid"/>'
        )
        p.append(
            f'<text x="{f.left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_e(y_format(t))}</text>'
        )
    for t in x_ticks:
        x = f.px(t)
        p.append(
            f'<line x1="{x:.1f}" y1="{height - f.bottom}" x2="{x:.1f}" y2="{height - f.bottom + 4}" class="axis"/>'
        )
        p.append(
            f'<text x="{x:.1f}" y="{height - f.bottom + 16}" class="tick" text-anchor="middle">{_e(x_format(t))}</text>'
        )
    p.append(
        f'<line x1="{f.left}" y1="{height - f.bottom}" x2="{width - f.right}" y2="{height - f.bottom}" class="axis"/>'
    )
    p.append(
        f'<line x1="{f.left}" y1="{f.top}" x2="{f.left}" y2="{height - f.bottom}" class="axis"/>'
    )


def _axis_labels(f: _Frame, x_label: str, y_label: str) -> None:
    """The x axis's label under it, the y axis's turned along it."""
    width, height = f.width, f.height
    f.parts.append(
        f'<text x="{(f.left + width - f.right) / 2:.1f}" y="{height - 8}" class="label" text-anchor="middle">{_e(x_label)}</text>'
    )
    cy = (f.top + height - f.bottom) / 2
    f.parts.append(
        f'<text x="14" y="{cy:.1f}" class="label" text-anchor="middle" transform="rotate(-90 14 {cy:.1f})">{_e(y_label)}</text>'
    )


def _marks(f: _Frame, marks: Sequence[Mark]) -> None:
    """A dashed vertical line per mark (a checkpoint, a restart), its kind and label as a tip."""
    for m in marks:
        x = f.px(m.x)
        color = MARK_COLORS.get(m.kind, "#6b7280")
        dash = "2,3" if m.kind == "checkpoint" else "5,3"
        f.parts.append(
            f'<line x1="{x:.1f}" y1="{f.top}" x2="{x:.1f}" y2="{f.height - f.bottom}" stroke="{color}" '
            f'stroke-dasharray="{dash}" class="mark mark-{_e(m.kind)}"><title>{_e(m.kind)}: {_e(m.label)}</title></line>'
        )


def _lines(f: _Frame, lines: Sequence[tuple[Series, list[tuple[float, float]]]]) -> None:
    """Each series as a path broken at its gaps; a lone point between gaps as a dot."""
    for i, (s, pts) in enumerate(lines):
        color = s.color or PALETTE[i % len(PALETTE)]
        segments = _segments(pts)
        if not segments:
            continue
        d = " ".join(
            f"{'M' if j == 0 else 'L'}{f.px(x):.1f},{f.py(y):.1f}"
            for seg in segments
            for j, (x, y) in enumerate(seg)
        )
        f.parts.append(
            f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5" class="series">'
            f"<title>{_e(s.name)}</title></path>"
        )
        for seg in segments:
            if len(seg) == 1:
                x, y = seg[0]
                f.parts.append(
                    f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="2.5" fill="{color}"/>'
                )


def _legend(f: _Frame, series: Sequence[Series], marks: Sequence[Mark]) -> None:
    """The legend's own row under the title: each series' line, then each kind of mark."""
    legend = [(s.name, s.color or PALETTE[i % len(PALETTE)], "line") for i, s in enumerate(series)]
    legend += [
        (kind, MARK_COLORS.get(kind, "#6b7280"), "mark")
        for kind in dict.fromkeys(m.kind for m in marks)
    ]
    lx = float(f.left)
    for name, color, style in legend:
        label = name.replace("_", " ")
        if style == "line":
            f.parts.append(
                f'<line x1="{lx:.0f}" y1="32" x2="{lx + 16:.0f}" y2="32" stroke="{color}" stroke-width="2"/>'
            )
        else:
            f.parts.append(
                f'<line x1="{lx + 8:.0f}" y1="25" x2="{lx + 8:.0f}" y2="39" stroke="{color}" '
                f'stroke-dasharray="3,2"/>'
            )
        f.parts.append(f'<text x="{lx + 20:.0f}" y="36" class="legend">{_e(label)}</text>')
        lx += 20 + 6.5 * len(label) + 18


def stacked_bar(
    parts: Sequence[tuple[str, float]],
    *,
    title: str,
    unit: Callable[[float], str],
    width: int = 760,
) -> str:
    """One horizontal bar split into named parts, with a legend giving each part's value."""
    total = sum(v for _, v in parts if v > 0)
    if total <= 0:
        return _empty(title, width, "nothing recorded")
    rows = math.ceil(len(parts) / 3)
    height = 64 + 18 * rows
    p = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart bar" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">',
        f"<title>{_e(title)}</title>",
        f'<text x="8" y="16" class="chart-title">{_e(title)}</text>',
    ]
    x = 8.0
    span = width - 16
    for i, (name, value) in enumerate(parts):
        if value <= 0:
            continue
        w = value / total * span
        color = colour(name) or PALETTE[i % len(PALETTE)]  # a part's tone: record/glossary
        p.append(
            f'<rect x="{x:.1f}" y="24" width="{max(w, 0.5):.1f}" height="20" fill="{color}">'
            f"<title>{_e(name)}: {_e(unit(value))} ({100 * value / total:.1f}%)</title></rect>"
        )
        x += w
    for i, (name, value) in enumerate(parts):
        col, row = i % 3, i // 3
        lx, ly = 8 + col * (span / 3), 62 + row * 18
        color = colour(name) or PALETTE[i % len(PALETTE)]
        share = 100 * max(value, 0) / total
        p.append(f'<rect x="{lx:.1f}" y="{ly - 10}" width="10" height="10" fill="{color}"/>')
        p.append(
            f'<text x="{lx + 14:.1f}" y="{ly}" class="legend">{_e(label(name))} '
            f"{_e(unit(value))} ({share:.0f}%)</text>"
        )
    p.append("</svg>")
    return "".join(p)


def _empty(title: str, width: int, why: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart empty" role="img" '
        f'viewBox="0 0 {width} 60" width="{width}" height="60"><title>{_e(title)}</title>'
        f'<text x="8" y="18" class="chart-title">{_e(title)}</text>'
        f'<text x="8" y="44" class="tick">{_e(why)}</text></svg>'
    )
