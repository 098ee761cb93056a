"""Fail a run whose store session expired while it ran.

A run reads the whole ledger tree through one session, then decides from what it read. If
that session expires in between (a long GC pause, a frozen VM, a partition longer than the
session timeout), the store forgets it: its ephemeral keys are gone, and what was read before
is no longer one view of the cluster that anything downstream can rely on. kazoo quietly opens
a new session and the next calls succeed, so without a guard the run would go on and record a
COMPLETED audit built across the gap. Fail closed: the run stops at its next step with
:class:`SessionLost`, and the operator reruns it.
"""

from __future__ import annotations

import threading
from types import TracebackType

from bklib.meta.stores.base import MetadataStore, SessionState, StoreUnavailable

__all__ = ["SessionGuard", "SessionLost"]


class SessionLost(StoreUnavailable):
    """The store session expired during a run; the step it was in is named."""


class SessionGuard:
    """Listens to ``store``'s session while in a ``with`` block; :meth:`check` raises
    :class:`SessionLost` once the session has been LOST. ``store`` None (a Spark task that
    opens its own sessions, a locator not yet opened) guards nothing."""

    def __init__(self, store: MetadataStore | None) -> None:
        self.store = store
        self._lost = threading.Event()

    def _on_state(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self._lost.set()

    def __enter__(self) -> SessionGuard:
        if self.store is not None:
            self.store.add_state_listener(self._on_state)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.store is not None:
            self.store.remove_state_listener(self._on_state)

    @property
    def lost(self) -> bool:
        """True once the session expired inside the block."""
        return self._lost.is_set()

    def check(self, step: str) -> None:
        """Raise :class:`SessionLost` if the session expired before the end of ``step``."""
        if self.store is not None and self.lost:
            raise SessionLost(
                f"the {self.store.kind} session at {self.store.locator} expired during "
                f"{step}; what the run read is not one view of the cluster, so nothing is "
                "recorded as completed: run it again"
            )
