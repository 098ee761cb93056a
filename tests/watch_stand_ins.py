"""Stand-ins for the watch cycle's unit tests (tests/unit/test_watch_cycle_*.py): a clock the
test moves, and a watcher that last saw the victim gone and no marks."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bklib.meta.paths import LayoutKind
from bklib.meta.stores import StoreUnavailable
from jobs.watch.config import WatchConfig
from jobs.watch.cycle import Cycle
from jobs.watch.election import Leadership
from jobs.watch.http_server import Health
from jobs.watch.metrics import WatchMetrics
from jobs.watch.warehouse import WatchWarehouse
from jobs.watch.watcher import ClusterSnapshot

FULL_SCAN_PLAN = SimpleNamespace(kind=LayoutKind.HIERARCHICAL)
"""The plan a stand-in full audit reports (the index is built from its ``ledgers``)."""


def audit_job(run: Any, ledgers: list[Any]) -> SimpleNamespace:
    """A stand-in audit job of ``run`` that read ``ledgers`` (views), as the cycle uses one."""
    job = SimpleNamespace(run=run, bookies=[], findings=[], plan=FULL_SCAN_PLAN, ledgers=ledgers)
    job.column_halves = lambda: []
    job.forget_ledgers = lambda: setattr(job, "ledgers", [])
    return job


VICTIM = "10.0.0.3:3181"
OTHERS = frozenset({"10.0.0.1:3181", "10.0.0.2:3181"})


class Clock:
    """A clock that moves only when the test sets ``now``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoFeedStore:
    """A session whose store refuses a change feed (as a ZooKeeper before 3.6 does)."""

    def watch_tree(self, path: str, *_: object) -> None:
        raise StoreUnavailable("no persistent recursive watch here", path=path)

    def get_many(self, paths: Any, *_: object) -> None:
        # These cycles' audits and repairs are stand-ins: a loss's first ledgers are not read.
        raise StoreUnavailable("no reads here", path=next(iter(paths), None))


class Feed:
    """A change feed whose barrier is confirmed while ``flowing``."""

    def __init__(self) -> None:
        self.flowing = True
        self.open = True

    def barrier(self, timeout: float) -> bool:
        return self.flowing and self.open

    def close(self) -> None:
        self.open = False


class FeedStore:
    """The watch's session as far as the index uses it: a feed per ``watch_tree``."""

    def __init__(self) -> None:
        self.feeds: list[Feed] = []
        self.gaps: list[Any] = []

    def watch_tree(self, path: str, on_change: Any, on_gap: Any) -> Feed:
        self.feeds.append(Feed())
        self.gaps.append(on_gap)
        return self.feeds[-1]


class Watcher:
    """The registrations as the cycle last saw them: the victim gone, no marks."""

    def __init__(self) -> None:
        self.connected = True
        self.lost_sessions = 0
        self.wake = threading.Event()
        # The watch's session: these cycles' audits and repairs are stand-ins, and it offers
        # no change feed (the bookie index stays stale: each loss is a full audit).
        self.zk = NoFeedStore()
        self.urm = SimpleNamespace(list_underreplicated=lambda: iter(()))

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            writable=OTHERS, readonly=frozenset(), delay_znode=None, disabled=False
        )


class Election:
    """Always the leader, in its current session."""

    def in_current_session(self) -> bool:
        return True

    def is_leader(self) -> bool:
        return True


def leader_cycle(tmp_path: Path, election: Any = None, **config: Any) -> Cycle:
    """A leading :class:`Cycle` over the stand-in :class:`Watcher` (``config``: more
    :class:`WatchConfig` fields); its audits and repairs are the caller's to stand in."""
    cfg = WatchConfig(
        zk="127.0.0.1:1",
        warehouse=str(tmp_path / "wh"),
        spool_dir=str(tmp_path / "spool"),
        **config,
    )
    metrics = WatchMetrics()
    health = Health(stale_after=60.0, max_failed_cycles=cfg.max_failed_cycles)
    watcher = Watcher()
    leadership = Leadership(election or Election(), watcher, threading.Event(), health, metrics)
    leadership.leading = True
    warehouse = WatchWarehouse(cfg, metrics, health, leading=lambda: leadership.leading)
    return Cycle(cfg, metrics, health, watcher, leadership, warehouse)  # type: ignore[arg-type]
