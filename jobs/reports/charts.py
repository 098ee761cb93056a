"""The report's charts: inline SVG strings from small Python lists, pure. Every bar
segment carries ``data-*`` attributes, so the report test reads the figures back from the
DOM (docs/operations.md).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any


def esc(value: Any) -> str:
    """``value`` escaped for HTML text and attribute values; ``None`` is empty."""
    return html.escape("" if value is None else str(value), quote=True)


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} {units[i]}" if i == 0 else f"{n:.1f} {units[i]}"


def nice_max(value: float) -> float:
    """The smallest 1/2/5 x 10^k at or above ``value`` (axis top); 1 for 0."""
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * exp >= value:
            return float(m * exp)
    return float(10 * exp)


def nice_bytes_max(value: float) -> float:
    """:func:`nice_max` in the binary unit of ``value``, so byte axes read 0, 10, 20 KiB."""
    scale = 1.0
    while value / scale >= 1024:
        scale *= 1024
    return nice_max(value / scale) * scale


def axis_ticks(top: float) -> list[float]:
    """Tick values from 0 to ``top`` (a :func:`nice_max` value): steps of 1, 2 or 5 x 10^k, so
    a count axis reads 0, 1, 2 ... rather than 1.25, 2.5 ..."""
    lead = round(top / 10 ** math.floor(math.log10(top)))
    if lead not in (1, 2, 5):  # a binary-scaled top (nice_bytes_max): use its unit's digits
        unit = 1024 ** math.floor(math.log(top, 1024))
        lead = round(top / unit / 10 ** math.floor(math.log10(top / unit)))
    n = 4 if lead == 2 else 5
    return [top * k / n for k in range(n + 1)]


def svg_hbar_chart(
    chart_id: str,
    rows: Sequence[tuple[str, dict[str, float]]],
    series: Sequence[str],
    colors: dict[str, str],
    unit: str = "",
    empty: str = "nothing to show",
) -> str:
    """Horizontal stacked bars, one per label. Each bar segment is a ``rect`` carrying
    ``data-label``, ``data-series`` and ``data-value``; a ``title`` gives the tooltip."""
    if not rows:
        return f'<div class="empty" data-chart="{esc(chart_id)}">{esc(empty)}</div>'
    left, width, bar, gap = 170, 620, 26, 10
    top = nice_max(max(sum(v.values()) for _, v in rows))
    height = len(rows) * (bar + gap) + 30
    out = [
        f'<svg class="chart" data-chart="{esc(chart_id)}" viewBox="0 0 {left + width + 20} '
        f'{height}" width="100%" role="img">'
    ]
    for i, (label, values) in enumerate(rows):
        y = i * (bar + gap) + 4
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{esc(label)}</text>')
        x = float(left)
        for s in series:
            v = float(values.get(s, 0))
            if v <= 0:
                continue
            w = width * v / top
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{colors[s]}" '
                f'data-label="{esc(label)}" data-series="{esc(s)}" data-value="{v:g}">'
                f"<title>{esc(label)}: {v:g} {esc(s)} {esc(unit)}</title></rect>"
            )
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{sum(values.values()):g}</text>')
    axis_y = len(rows) * (bar + gap) + 4
    out.append(
        f'<line x1="{left}" y1="{axis_y}" x2="{left + width}" y2="{axis_y}" stroke="#9ca3af"/>'
    )
    for t in axis_ticks(top):
        x = left + width * t / top
        out.append(f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle">{t:g}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_column_chart(
    chart_id: str,
    columns: Sequence[tuple[str, str, dict[str, float]]],
    series: Sequence[str],
    colors: dict[str, str],
    value_format: Any = None,
    top_of: Any = None,
) -> str:
    """Vertical stacked columns over time: ``(key, x label, {series: value})`` per column.
    Every column gets a ``g`` with ``data-key``; segments are ``rect`` with ``data-series``
    and ``data-value`` (zero-height columns still carry their data)."""
    if not columns:
        return f'<div class="empty" data-chart="{esc(chart_id)}">nothing to show</div>'
    fmt = value_format or (lambda v: f"{v:g}")
    left, width, height, bottom = 64, 700, 220, 50
    top = (top_of or nice_max)(max(sum(v.values()) for _, _, v in columns))
    step = width / len(columns)
    bar = max(2.0, min(40.0, step * 0.7))
    out = [
        f'<svg class="chart" data-chart="{esc(chart_id)}" viewBox="0 0 {left + width + 10} '
        f'{height + bottom}" width="100%" role="img">'
    ]
    for t in axis_ticks(top):
        y = height - height * t / top + 6
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + width}" y2="{y:.1f}" stroke="#e5e7eb"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(fmt(t))}</text>'
        )
    label_every = max(1, math.ceil(len(columns) / 10))
    for i, (key, label, values) in enumerate(columns):
        x = left + i * step + (step - bar) / 2
        y = height + 6.0
        total = sum(values.values())
        out.append(f'<g data-key="{esc(key)}" data-total="{total:g}">')
        for s in series:
            v = float(values.get(s, 0))
            h = height * v / top
            y -= h
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colors[s]}" data-series="{esc(s)}" data-value="{v:g}">'
                f"<title>{esc(label)}: {esc(fmt(v))} {esc(s)}</title></rect>"
            )
        out.append("</g>")
        if i % label_every == 0:
            out.append(
                f'<text x="{x + bar / 2:.1f}" y="{height + 22}" text-anchor="middle">'
                f"{esc(label)}</text>"
            )
    out.append(
        f'<line x1="{left}" y1="{height + 6}" x2="{left + width}" y2="{height + 6}" '
        'stroke="#9ca3af"/></svg>'
    )
    return "".join(out)
