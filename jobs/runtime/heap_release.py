"""Give the heaps' free memory back to the system after a burst (glibc's ``malloc_trim``, and
Arrow's memory pool).

A long-lived process that built a large temporary state once (the watch's take-over scan of a
million ledgers) keeps the freed pages in its allocator's arenas: its RSS stays at the burst's
size for the rest of its life, though Python freed the objects. ``malloc_trim(0)`` returns
what the arenas hold free. Where the C library has no such call (musl, macOS) nothing is done.
Arrow's own pool (mimalloc or jemalloc, which hold the scan's rows) keeps freed pages for reuse
too; it is asked to let them go.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

__all__ = ["release_heap"]

log = logging.getLogger(__name__)


def release_heap() -> bool:
    """Collect cycles, then return free heap pages to the system; True if the C library
    could be asked."""
    gc.collect()
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
