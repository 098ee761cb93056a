"""SIGTERM ends any bkaudit command cleanly, also as PID 1 of a container.

The kernel drops a signal that PID 1 has no handler for, so a container whose first process
is ``bkaudit`` (no ``--init``) would ignore ``docker stop`` / a Pod's termination until it is
killed. With this handler SIGTERM raises :class:`SystemExit` (status 143, as a shell reports a
process ended by SIGTERM): ``finally`` blocks run, ZooKeeper sessions close, a run in progress
is recorded as its executor records an interrupted run. ``bkaudit watch`` installs its own
handler, which drains the ledgers in flight first (:class:`jobs.watch.loop.WatchService`).
"""

from __future__ import annotations

import signal
from types import FrameType

EXIT_ON_SIGTERM = 128 + signal.SIGTERM


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise :class:`SystemExit`, unless a handler is already installed."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _exit)
