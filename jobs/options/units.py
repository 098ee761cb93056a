"""The sizes, rates and durations operators type in flags and ``conf/bkaudit.yaml``."""

from __future__ import annotations

import argparse
import re

__all__ = [
    "parse_count",
    "parse_duration",
    "parse_percentage",
    "parse_rate",
    "parse_request_rate",
    "parse_size",
]

_SIZE_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9}
_SIZE_UNITS |= {"GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_TIME_UNITS = {"": 1, "S": 1, "MS": 1e-3, "M": 60, "MIN": 60, "H": 3600, "D": 86400, "W": 604800}


def parse_size(text: str) -> int:
    """Bytes from ``2GiB``, ``500MB``, ``1000``."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).upper() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 2GiB, 500MB)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


def parse_rate(text: str) -> float | None:
    """Bytes/s from ``50MB``, ``50MB/s``, ``1GiB``, ``1000000``; ``0`` or ``unlimited``: None."""
    if text.strip().lower() in ("0", "unlimited", "none"):
        return None
    try:
        return float(parse_size(text.strip().removesuffix("/s")))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"bad rate {text!r} (use e.g. 50MB, 20MiB, 0)") from None


def parse_request_rate(text: str) -> float | None:
    """Requests/s from ``5000``, ``5000/s``, ``2.5k``; ``0`` or ``unlimited``: None."""
    body = text.strip().lower().removesuffix("/s")
    if body in ("0", "unlimited", "none"):
        return None
    scale = 1000.0 if body.endswith("k") else 1.0
    try:
        value = float(body.removesuffix("k")) * scale
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"bad request rate {text!r} (use e.g. 5000, 20k, 0)")
    return value


def parse_duration(text: str) -> float:
    """Seconds from ``30``, ``30s``, ``500ms``, ``5m``, ``1h``, ``1d``, ``2w``."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).upper() not in _TIME_UNITS:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (use e.g. 30s, 5m, 500ms, 7d)")
    return float(m.group(1)) * _TIME_UNITS[m.group(2).upper()]


def parse_percentage(text: str) -> float:
    """A percentage from ``10``, ``10%``, ``2.5``: between 0 and 100."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"bad percentage {text!r} (use 0 to 100)")
    return value


def parse_count(text: str) -> int:
    """A whole number, 0 or more, from ``0``, ``4``."""
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"bad count {text!r} (use 0 or a positive whole number)")
    return value
