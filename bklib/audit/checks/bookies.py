"""The checks that ask the bookies: a :class:`~bklib.audit.checker.ReplicaChecker` reads
(as BookKeeper's ``LedgerChecker`` does), then the classifier judges each ledger."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from bklib.audit.checks.base import AuditCheck, Checked

if TYPE_CHECKING:
    from bklib.audit.checker import CheckSettings
    from bklib.audit.model import LedgerView

__all__ = ["BookieCheck"]


class BookieCheck(AuditCheck):
    """A check that reads from the bookies with a bookie client."""

    reads_entries = True
    samples: ClassVar[bool] = False
    """Reads a sample of each fragment (the first and last entry, plus a percentage)."""
    verifies_digests: ClassVar[bool] = False
    """Reads entries and verifies their digests (else asks for entry lists)."""

    def check_ledgers(
        self,
        ledgers: Iterable[LedgerView],
        lost: frozenset[str],
        *,
        client: Any = None,
        settings: CheckSettings | None = None,
        on_checker: Callable[[Any], None] | None = None,
    ) -> Checked:
        """Ask the bookies with ``client`` (a :class:`~bklib.client.pool.SyncBookieClient`),
        then classify; ``on_checker`` receives the checker, so a caller can read what it
        learnt about each bookie afterwards."""
        from bklib.audit.checker import CheckSettings, ReplicaChecker
        from bklib.audit.classify import classify_ledger, ledger_lac

        if client is None:
            raise ValueError(f"the {self.name} check needs a bookie client")
        checker = ReplicaChecker(
            client,
            settings or CheckSettings(),
            lost,
            sample=self.samples,
            deep=self.verifies_digests,
        )
        if on_checker is not None:
            on_checker(checker)
        for ledger, reports in checker.check(ledgers):
            replicas = {r.bookie_id: r for r in reports}
            yield ledger, reports, classify_ledger(ledger, lost, replicas, ledger_lac(reports))
