"""Server-rendered SVG charts: no JavaScript, no CDN, they work offline.

Sizes are in CSS pixels: a chart is drawn as wide as a dashboard panel (about
460 px) so its 12 px text is not scaled down (``max-width: 100%`` only shrinks
it on narrow screens).

Each function returns a complete ``<svg>`` element as safe HTML. Labels are
escaped; numbers are formatted here. Colours come from the caller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

FONT = 'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif" font-size="12"'
AXIS = "#9ca3af"
GRID = "#e5e7eb"


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)  # pragma: no cover


def _num(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    if value == int(value):
        return f"{int(value)}"
    return f"{value:.1f}"


def _px(value: float) -> str:
    return f"{value:.1f}"


def _svg(width: int, height: int, label: str, body: list[str], css: str = "") -> SafeString:
    head = format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="js-chart {}" viewBox="0 0 {} {}" '
        'width="{}" height="{}" role="img" aria-label="{}" {}><title>{}</title>',
        css,
        width,
        height,
        width,
        height,
        label,
        mark_safe(FONT),
        label,
    )
    return mark_safe(head + "".join(body) + "</svg>")


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    colour: str
    href: str = ""
    note: str = ""


def bar_chart(bars: Sequence[Bar], *, label: str, width: int = 460, row: int = 24) -> SafeString:
    """Horizontal bars, one per row, with the label on the left and the value on the right."""
    label_w, value_w = 130, 70
    plot_w = width - label_w - value_w
    height = max(row * len(bars) + 8, 30)
    top = max((b.value for b in bars), default=0) or 1
    body: list[str] = []
    if not bars:
        body.append(format_html('<text x="{}" y="20" fill="{}">no data</text>', 4, AXIS))
    for i, bar in enumerate(bars):
        y = 4 + i * row
        w = 0 if bar.value <= 0 else max(2.0, plot_w * bar.value / top)
        title = f"{bar.label}: {bar.value:,.0f}" + (f" ({bar.note})" if bar.note else "")
        rect = format_html(
            '<rect class="js-bar" x="{}" y="{}" width="{}" height="{}" rx="3" fill="{}">'
            "<title>{}</title></rect>",
            label_w,
            y + 3,
            _px(w),
            row - 8,
            bar.colour,
            title,
        )
        text = format_html(
            '<text x="{}" y="{}" text-anchor="end" fill="currentColor">{}</text>',
            label_w - 8,
            _px(y + row / 2 + 3),
            bar.label[:22],
        )
        if bar.href:
            text = format_html('<a href="{}">{}</a>', bar.href, text)
        value = format_html(
            '<text x="{}" y="{}" fill="currentColor">{}{}</text>',
            _px(label_w + w + 6),
            _px(y + row / 2 + 3),
            f"{bar.value:,.0f}",
            f" · {bar.note}" if bar.note else "",
        )
        body += [text, rect, value]
    return _svg(width, height, label, body, "js-bar-chart")


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    values: Sequence[float]


def time_chart(
    times: Sequence[datetime],
    series: Sequence[Series],
    *,
    label: str,
    tick_format: str = "%H:%M",
    ticks: int = 6,
    kind: str = "area",
    width: int = 460,
    height: int = 200,
) -> SafeString:
    """Stacked areas (``kind="area"``) or stacked columns (``kind="columns"``) over time."""
    left, right, top_pad, bottom = 44, 10, 10, 34
    plot_w, plot_h = width - left - right, height - top_pad - bottom
    n = len(times)
    totals = [sum(s.values[i] for s in series) for i in range(n)]
    top = nice_max(max(totals, default=0))
    body: list[str] = []
    for frac in (0, 0.5, 1):
        y = top_pad + plot_h * (1 - frac)
        body.append(
            format_html(
                '<line class="{}" x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="1"/>'
                '<text x="{}" y="{}" text-anchor="end" fill="{}">{}</text>',
                "js-gridline" if frac else "js-axis",
                left,
                width - right,
                _px(y),
                _px(y),
                GRID if frac else AXIS,
                left - 6,
                _px(y + 4),
                AXIS,
                _num(top * frac),
            )
        )
    if n == 0:
        body.append(format_html('<text x="{}" y="{}" fill="{}">no data</text>', left + 8, top_pad + 20, AXIS))
        return _svg(width, height, label, body, "js-time-chart")

    def x_at(i: float) -> float:
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y_at(v: float) -> float:
        return top_pad + plot_h * (1 - v / top)

    base = [0.0] * n
    slot = plot_w / n
    for s in [s for s in series if any(s.values)]:
        upper = [base[i] + s.values[i] for i in range(n)]
        if kind == "columns":
            for i in range(n):
                if s.values[i] <= 0:
                    continue
                body.append(
                    format_html(
                        '<rect class="js-column" x="{}" y="{}" width="{}" height="{}" '
                        'fill="{}"><title>{} {}: {}</title></rect>',
                        _px(left + i * slot + slot * 0.12),
                        _px(y_at(upper[i])),
                        _px(slot * 0.76),
                        _px(y_at(base[i]) - y_at(upper[i])),
                        s.colour,
                        times[i].strftime(tick_format),
                        s.name,
                        _num(s.values[i]),
                    )
                )
        else:
            points = [f"{x_at(i):.1f},{y_at(upper[i]):.1f}" for i in range(n)]
            points += [f"{x_at(i):.1f},{y_at(base[i]):.1f}" for i in reversed(range(n))]
            body.append(
                format_html(
                    '<polygon class="js-area" points="{}" fill="{}" fill-opacity="0.6">'
                    "<title>{}</title></polygon>",
                    " ".join(points),
                    s.colour,
                    s.name,
                )
            )
        base = upper
    if kind != "columns" and any(base):
        # One outline for the total; per-series outlines would paint over each other.
        body.append(
            format_html(
                '<polyline points="{}" fill="none" stroke="currentColor" stroke-opacity="0.55" '
                'stroke-width="1.2"/>',
                " ".join(f"{x_at(i):.1f},{y_at(base[i]):.1f}" for i in range(n)),
            )
        )
    step = max(1, math.ceil(n / ticks))
    for i in range(0, n, step):
        x = left + i * slot + slot / 2 if kind == "columns" else x_at(i)
        body.append(
            format_html(
                '<text x="{}" y="{}" text-anchor="middle" fill="{}">{}</text>',
                _px(x),
                height - bottom + 16,
                AXIS,
                times[i].strftime(tick_format),
            )
        )
    legend_x = left
    for s in series:
        body.append(
            format_html(
                '<rect x="{}" y="{}" width="10" height="10" fill="{}"/>'
                '<text x="{}" y="{}" fill="currentColor">{}</text>',
                legend_x,
                height - 11,
                s.colour,
                legend_x + 14,
                height - 2,
                s.name,
            )
        )
        legend_x += 26 + 7 * len(s.name)
    return _svg(width, height, label, body, "js-time-chart")


def spark_range(p50: float | None, p95: float | None, top: float, *, width: int = 160) -> SafeString:
    """A tiny bar: p50 solid, p95 lighter, against the longest p95 in the table."""
    if p95 is None or top <= 0:
        return mark_safe("")
    w50 = width * (p50 or 0) / top
    w95 = width * p95 / top
    return mark_safe(
        f'<svg class="js-chart js-spark" viewBox="0 0 {width} 12" width="{width}" height="12" '
        f'role="img" aria-label="p50 and p95"><rect x="0" y="2" width="{max(w95, 1):.1f}" '
        f'height="8" rx="2" fill="#93c5fd"/><rect x="0" y="2" width="{max(w50, 1):.1f}" '
        f'height="8" rx="2" fill="#2563eb"/></svg>'
    )
