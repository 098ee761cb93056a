"""``release_heap`` gives a burst's freed memory back to the system (glibc), which the watch
does after its take-over scan (jobs/watch/cycle.py): freed C-heap chunks below one still in
use stay in the process until the heap is trimmed."""

from __future__ import annotations

import gc

import psutil

from jobs.runtime.heap_release import release_heap


def test_the_memory_of_a_freed_burst_leaves_the_process() -> None:
    me = psutil.Process()
    burst = [bytes(1000) + b"x" for _ in range(200_000)]  # 200 MB from malloc, not pymalloc
    keep = bytes(1000) + b"y"  # in use above them: the heap's top cannot shrink
    peak = me.memory_info().rss
    del burst
    gc.collect()
    kept = peak - me.memory_info().rss
    assert release_heap()
    released = peak - me.memory_info().rss
    # (Without the trim, ``kept`` is about 0 here: the chunks stay in the process.)
    assert released > 150 * 2**20, (kept, released)
    assert keep.endswith(b"y")
