"""A repair run's stop marker: how a driver that got SIGINT or SIGTERM tells workers in other
processes, on other hosts (Spark's tasks), to start no new ledger.

A signal reaches the driver, not the executors. Every task already holds a session to the
metadata store, so the driver says "stop" there: an ephemeral key of its own session under
bkaudit's namespace (:func:`bklib.meta.paths.own_path`), which a task reads before each ledger
it starts. Ephemeral, so a driver that dies leaves nothing behind; a run of its own, so
another run of the same cluster is never stopped by it.
"""

from __future__ import annotations

import logging
import threading

from bklib.errors import BKError
from bklib.meta import paths
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.base import KeyExists

__all__ = ["StopMarker", "stop_marker_path", "stopped_by"]

log = logging.getLogger("jobs.commands.repair")


def stop_marker_path(ledgers_root: str, run_id: str) -> str:
    """``/bkaudit<ledgers root>/repair-stop/<run id>``."""
    return paths.own_path(ledgers_root, "repair-stop", run_id)


class StopMarker:
    """The driver's side: :meth:`raise_soon` from a signal handler, :meth:`clear` once the
    run's tasks are done."""

    def __init__(self, session: MetadataStore, path: str) -> None:
        self.session = session
        self.path = path
        self.raised = threading.Event()

    def raise_soon(self) -> None:
        """Write the marker from a thread of its own: a signal handler must not wait on the
        store."""
        threading.Thread(target=self._raise, name="repair-stop", daemon=True).start()

    def _raise(self) -> None:
        try:
            self.session.create(self.path, ephemeral=True, parents=True)
        except KeyExists:
            pass
        except BKError as exc:
            # The tasks then run to their end; --stop-timeout still bounds the wait.
            log.warning("could not tell the tasks to stop at %s: %s", self.path, exc)
            return
        self.raised.set()
        log.info("told the run's tasks to start no new ledger (%s)", self.path)

    def clear(self) -> None:
        """Delete the marker, if it was written (it is ephemeral: a session that ends takes
        it too)."""
        if not self.raised.is_set():
            return
        try:
            self.session.delete(self.path)
        except BKError as exc:
            log.debug("stop marker %s left to the session's end: %s", self.path, exc)


def stopped_by(session: MetadataStore, path: str) -> bool:
    """A task's side: whether the driver asked the run to stop. A store that cannot answer
    does not stop the task: the ledger it starts meets the same store and records the
    failure, so no ledger goes unaccounted for."""
    try:
        return session.exists(path) is not None
    except BKError as exc:
        log.warning("could not read the stop marker %s: %s", path, exc)
        return False
