"""A Prometheus text page (``/metrics``) as the tests and benches read it."""

from __future__ import annotations

__all__ = ["samples"]


def samples(page: str) -> dict[str, float]:
    """Each sample of ``page``, keyed as written (``name{label="value",...}``)."""
    out = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
