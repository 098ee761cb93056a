"""How the report writes times, durations and the "not run" note: one place, so every section
says them alike."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobs.reports.charts import esc


def fmt_ts(value: Any) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS`` (UTC as stored); None is empty."""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return "" if value is None else str(value)


def fmt_duration(seconds: float | None) -> str:
    """``75`` -> ``1 min 15 s``, ``7300`` -> ``2 h 1 min``, ``90000`` -> ``1 d 1 h``: the two
    largest units; None is empty."""
    if seconds is None:
        return ""
    s = max(int(seconds), 0)
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    parts: list[str] = []
    for name, size in units:
        n, s = divmod(s, size)
        if n or parts:
            parts.append(f"{n} {name}")
        if len(parts) == 2:
            break
    parts = [p for p in parts if not p.startswith("0 ")] or ["0 s"]
    return " ".join(parts)


def duration_cell(seconds: float | None, suffix: str = "", missing: str = "") -> str:
    """A ``td`` with the duration as text and its seconds in ``data-seconds`` (empty when
    unknown, with ``missing`` as text)."""
    if seconds is None:
        return f'<td data-seconds="">{esc(missing)}</td>'
    text = fmt_duration(seconds) + suffix
    return f'<td class="num" data-seconds="{seconds:.3f}">{esc(text)}</td>'


def not_run(tid: str, what: str) -> str:
    """The neutral note of a section whose job never ran: not run is not clean."""
    return f'<p class="not-run" id="{esc(tid)}-not-run">not run: {esc(what)}</p>'
