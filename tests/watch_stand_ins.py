"""Stand-ins for the watch cycle's unit tests (tests/unit/test_watch_cycle_*.py): a clock the
test moves, and a watcher that last saw the victim gone and no marks."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from jobs.watch.watcher import ClusterSnapshot

VICTIM = "10.0.0.3:3181"
OTHERS = frozenset({"10.0.0.1:3181", "10.0.0.2:3181"})


class Clock:
    """A clock that moves only when the test sets ``now``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Watcher:
    """The registrations as the cycle last saw them: the victim gone, no marks."""

    def __init__(self) -> None:
        self.connected = True
        self.lost_sessions = 0
        self.wake = threading.Event()
        self.zk = None  # the watch's session: these cycles' audits and repairs are stand-ins
        self.urm = SimpleNamespace(list_underreplicated=lambda: iter(()))

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            writable=OTHERS, readonly=frozenset(), delay_znode=None, disabled=False
        )
