# SPDX-License-Identifier: Apache-2.0
"""Inline SVG time-series charts for the diagnose report: no JavaScript, no external assets.

One chart has a clock-time x axis (the wall clock the text report uses), a left y axis in the unit
of its left-hand lines with round ticks and grid lines, an optional right y axis for one more line
in another unit (the victim's latency against the top culprit's CPU), an optional threshold line
(the SLO), shaded time spans (the incident window) and a legend. Values are drawn as given: callers
convert to human units (ms, cores, %) before.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from html import escape

_DASH = ' stroke-dasharray="4 3"'
PALETTE = ("#c0392b", "#2471a3", "#7d3c98", "#1e8449", "#b9770e")


@dataclass
class Line:
    label: str  # legend text, e.g. "shop/api run-queue wait p99"
    points: list[tuple[float, float]]  # (epoch seconds, value in the axis unit)
    color: str = PALETTE[0]
    dashed: bool = False


@dataclass
class Chart:
    title: str
    unit: str  # left axis unit, e.g. "ms"
    lines: list[Line]
    right: Line | None = None  # drawn against its own axis on the right
    right_unit: str = ""
    threshold: float | None = None  # in the left unit
    threshold_label: str = "SLO"
    shaded: list[tuple[float, float, str]] = field(default_factory=list)  # (t0, t1, label)
    t_range: tuple[float, float] | None = None  # default: the data's span


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k steps) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v < hi + step * 0.999:
        ticks.append(round(v, 10))
        v += step
    return ticks


def fmt_value(v: float) -> str:
    """Tick labels: few digits, no exponent for the ranges a latency or CPU axis has."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.3f}".rstrip("0").rstrip(".")


def time_ticks(t0: float, t1: float, count: int = 6) -> list[float]:
    """Clock-aligned ticks (every 1, 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15, 30 min, 1 h)."""
    span = max(t1 - t0, 1.0)
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600) if span / s <= count), 3600)
    first = math.ceil(t0 / step) * step
    return [first + i * step for i in range(int((t1 - first) // step) + 1)]


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def render(chart: Chart, width: int = 760, height: int = 240) -> str:
    left_pad, right_pad = 56, 56 if chart.right else 28  # room for half a clock label at the right edge
    top_pad, bottom_pad = 12, 28
    plot_w, plot_h = width - left_pad - right_pad, height - top_pad - bottom_pad
    all_t = [t for line in [*chart.lines, *([chart.right] if chart.right else [])] for t, _ in line.points]
    if not all_t:
        return ""
    t0, t1 = chart.t_range or (min(all_t), max(all_t))
    if t1 <= t0:
        t1 = t0 + 1.0

    def x(t: float) -> float:
        return left_pad + (t - t0) / (t1 - t0) * plot_w

    def axis(values: list[float]) -> tuple[list[float], float, float]:
        hi = max(values, default=1.0)
        ticks = nice_ticks(0.0, hi if hi > 0 else 1.0)
        return ticks, ticks[0], ticks[-1]

    left_values = [v for line in chart.lines for _, v in line.points]
    if chart.threshold is not None:
        left_values.append(chart.threshold * 1.1)
    yticks, ylo, yhi = axis(left_values)

    def y(v: float, lo: float = ylo, hi: float = yhi) -> float:
        return top_pad + plot_h - (v - lo) / ((hi - lo) or 1.0) * plot_h

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(chart.title)}">']
    for s0, s1, label in chart.shaded:
        a, b = max(x(s0), left_pad), min(x(s1), left_pad + plot_w)
        if b > a:
            out.append(f'<rect x="{a:.1f}" y="{top_pad}" width="{b - a:.1f}" height="{plot_h}" fill="#f5b7b1" '
                       f'fill-opacity="0.35"><title>{escape(label)}</title></rect>')
            out.append(f'<text x="{a + 3:.1f}" y="{top_pad + 11}" font-size="10" fill="#922b21">{escape(label)}</text>')
    for v in yticks:
        out.append(f'<line x1="{left_pad}" x2="{left_pad + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left_pad - 6}" y="{y(v) + 3:.1f}" font-size="10" text-anchor="end">{fmt_value(v)}</text>')
    out.append(f'<text x="4" y="{top_pad + 8}" font-size="10" fill="#555">{escape(chart.unit)}</text>')
    for t in time_ticks(t0, t1):
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top_pad + plot_h}" y2="{top_pad + plot_h + 4}" stroke="#888"/>')
        # A label near the right edge ends at its tick instead of being centred past the picture.
        anchor = "end" if x(t) > width - 28 else "middle"
        out.append(f'<text x="{x(t):.1f}" y="{height - 10}" font-size="10" text-anchor="{anchor}">{clock(t)}</text>')
    out.append(f'<rect x="{left_pad}" y="{top_pad}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#bbb"/>')
    if chart.threshold is not None:
        ty = y(chart.threshold)
        out.append(f'<line x1="{left_pad}" x2="{left_pad + plot_w}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#e67e22" '
                   f'stroke-width="1.5" stroke-dasharray="6 4"/>')
        out.append(f'<text x="{left_pad + plot_w - 4}" y="{ty - 4:.1f}" font-size="10" text-anchor="end" fill="#b9770e">'
                   f'{escape(chart.threshold_label)} {fmt_value(chart.threshold)} {escape(chart.unit)}</text>')
    for line in chart.lines:
        out.append(_polyline(line, x, y))
    if chart.right is not None and chart.right.points:
        rticks, rlo, rhi = axis([v for _, v in chart.right.points])
        for v in rticks:
            out.append(f'<text x="{left_pad + plot_w + 6}" y="{y(v, rlo, rhi) + 3:.1f}" font-size="10" '
                       f'fill="{chart.right.color}">{fmt_value(v)}</text>')
        out.append(f'<text x="{width - 4}" y="{top_pad + 8}" font-size="10" text-anchor="end" '
                   f'fill="{chart.right.color}">{escape(chart.right_unit)}</text>')
        out.append(_polyline(chart.right, x, lambda v: y(v, rlo, rhi)))
    out.append("</svg>")
    legend = [*chart.lines, *([chart.right] if chart.right else [])]
    items = "".join(
        f'<span class="key"><svg width="22" height="8"><line x1="0" x2="22" y1="4" y2="4" stroke="{ln.color}" '
        f'stroke-width="2"{_DASH if ln.dashed else ""}/></svg>{escape(ln.label)}</span>'
        for ln in legend
    )
    if chart.threshold is not None:
        items += ('<span class="key"><svg width="22" height="8"><line x1="0" x2="22" y1="4" y2="4" stroke="#e67e22" '
                  f'stroke-width="1.5" stroke-dasharray="6 4"/></svg>{escape(chart.threshold_label)}</span>')
    if chart.shaded:
        items += '<span class="key"><span class="swatch"></span>incident window</span>'
    return f'<figure><figcaption>{escape(chart.title)}</figcaption>{"".join(out)}<div class="legend">{items}</div></figure>'


def _polyline(line: Line, x, y) -> str:
    pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in line.points)
    dash = ' stroke-dasharray="5 3"' if line.dashed else ""
    return f'<polyline fill="none" stroke="{line.color}" stroke-width="1.8"{dash} points="{pts}"/>'
