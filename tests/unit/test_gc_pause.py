"""``paused_gc``: the cyclic collector is off inside the block, back on after (and cycles made
meanwhile are collected), and left off for a caller that had turned it off."""

from __future__ import annotations

import gc
import weakref

from jobs.runtime.gc_pause import paused_gc


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_off_inside_back_on_after_with_the_cycles_collected() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        cycle = _Node()
        ref = weakref.ref(cycle)
        del cycle
        assert ref() is not None  # only the cyclic collector frees a cycle
    assert gc.isenabled()
    assert ref() is None


def test_a_caller_that_turned_it_off_keeps_it_off() -> None:
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
