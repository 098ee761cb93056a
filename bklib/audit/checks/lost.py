"""``lost``: metadata only, as BookKeeper's ``AuditorBookieCheckTask`` compares the ensembles
with the registered bookies."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from bklib.audit.checks.base import AuditCheck, Checked
from bklib.states import Check

if TYPE_CHECKING:
    from bklib.audit.checker import CheckSettings
    from bklib.audit.model import LedgerView

__all__ = ["LostCheck"]


class LostCheck(AuditCheck):
    """Fragments naming a bookie that is not registered; no bookie is asked."""

    name = Check.LOST
    summary = "metadata only (fragments on bookies that are not registered)"
    asks = "nothing"
    finds = "fragments on bookies that are not registered (BOOKIE_LOST)"
    misses = "anything on a registered bookie"
    cost = "metadata only: one ZooKeeper read per ledger"

    def check_ledgers(
        self,
        ledgers: Iterable[LedgerView],
        lost: frozenset[str],
        *,
        client: Any = None,
        settings: CheckSettings | None = None,
        on_checker: Callable[[Any], None] | None = None,
    ) -> Checked:
        """Classify each readable ledger from its metadata alone (``client`` unused)."""
        from bklib.audit.classify import classify_ledger

        for ledger in ledgers:
            if ledger.ok:
                yield ledger, [], classify_ledger(ledger, lost, None)
