"""How many cores this process may use: what sizes the local executor's processes, the scan's
helper, the blast radius's workers and Spark's ``local[*]``."""

from __future__ import annotations

import os

__all__ = ["usable_cores"]


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, which a container's cpuset limits
    (``os.cpu_count`` counts the host's), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
