"""``usable_cores`` follows the process's CPU affinity (a container's cpuset), not the host."""

from __future__ import annotations

import os

import pytest

from jobs.runtime.cores import usable_cores


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_follows_the_affinity() -> None:
    allowed = os.sched_getaffinity(0)
    assert usable_cores() == len(allowed)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, allowed)
    assert usable_cores() == len(allowed)
