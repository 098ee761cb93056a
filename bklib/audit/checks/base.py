"""What one kind of audit check is: a class, as each of BookKeeper's ``AuditorTask``
subclasses is one (``AuditorCheckAllLedgersTask``, ``AuditorBookieCheckTask``, ...).

A kind says what it asks the bookies, finds, misses and costs (the table of docs/checks.md),
a one-line summary (``audit --check``'s help, the Airflow DAG's ``check`` Param,
conf/bkaudit.yaml), and what the engine needs to run it. The registry
(:mod:`bklib.audit.checks.registry`) lists the kinds; everything that lists checks is derived
from it (:mod:`bklib.audit.checks.render`).

Imports nothing outside the standard library at import time (the check's own machinery is
imported when it runs), so the Airflow worker can read the registry without bkaudit's
dependencies, as it reads :mod:`bklib.states`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from bklib.audit.checker import CheckSettings
    from bklib.audit.model import Finding, LedgerView, ReplicaReport

__all__ = ["AuditCheck", "Checked"]

Checked = Iterator[tuple["LedgerView", list["ReplicaReport"], list["Finding"]]]
"""Each readable ledger with what its bookies answered and its findings."""


class AuditCheck:
    """One kind of check. Subclasses set the class attributes; the registry holds one
    instance of each."""

    name: ClassVar[str]
    """``--check`` value and ``audit_runs.check``: stored in tables, never renamed."""
    summary: ClassVar[str]
    """One line: ``--check``'s help, the DAG's Param, conf/bkaudit.yaml."""
    asks: ClassVar[str]
    """docs/checks.md's "asks the bookies" column (Markdown)."""
    finds: ClassVar[str]
    """docs/checks.md's "finds" column."""
    misses: ClassVar[str]
    """docs/checks.md's "misses" column."""
    cost: ClassVar[str]
    """docs/checks.md's "cost" column."""
    reads_entries: ClassVar[bool] = False
    """Asks the bookies (with a bookie client); else reads metadata only."""
    learns_capabilities: ClassVar[bool] = False
    """The run first asks each bookie what it answers
    (:func:`bklib.audit.engine.learn_bookies`)."""
    ask_list: ClassVar[bool] = False
    """That capability probe asks for GET_LIST_OF_ENTRIES_OF_LEDGER too."""
    replication: ClassVar[bool] = True
    """One of BookKeeper's replication checks, written to ``audit_runs`` and repaired by
    ``rereplicate`` (the watch schedules them, the DAG runs them); else a check with tables of
    its own."""

    def check_ledgers(
        self,
        ledgers: Iterable[LedgerView],
        lost: frozenset[str],
        *,
        client: Any = None,
        settings: CheckSettings | None = None,
        on_checker: Callable[[Any], None] | None = None,
    ) -> Checked:
        """Each readable ledger of ``ledgers`` with what its bookies answered and its findings
        (:func:`bklib.audit.engine.check_ledgers`); ``lost`` are the bookies known gone."""
        raise ValueError(f"the {self.name} check does not check ledgers one by one")

    def __repr__(self) -> str:
        return f"<check {self.name}>"
