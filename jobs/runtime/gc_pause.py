"""Python's cyclic garbage collector held off while a run builds its in-memory state.

A local audit keeps every ledger's metadata, answers and rows alive until its commit: millions
of long-lived objects and almost no cycles. The collector's full passes, triggered as that heap
grows, then rescan it over and over: about a fifth of the CPU of a 100,000-ledger lost audit
(docs/benchmarks.md, "At production size"). Reference counting still frees everything that
is not in a cycle; the cycles left are collected once, at the end.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block (if it was on), collect once after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
            gc.collect()
