"""What a repair did, as rows of ``replication_actions``, and the metadata transform every
repair path applies (shared by :mod:`bklib.repair.worker` and
:mod:`bklib.repair.placement_fix`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bklib.errors import ReplicationError
from bklib.meta.model import LedgerMetadata

__all__ = ["Action", "describe", "recovery_swap", "replace_in_segment"]


@dataclass
class Action:
    """One row of ``replication_actions`` (the job adds run_id, mode and audit_run_id)."""

    ledger_id: int
    action: str
    status: str
    segment_first_entry_id: int | None = None
    segment_last_entry_id: int | None = None
    old_bookie: str | None = None
    new_bookie: str | None = None
    entries_copied: int = 0
    bytes_copied: int = 0
    no_replica_entries: list[int] | None = None
    error: str | None = None
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    finished_at: datetime | None = None

    def finish(self) -> Action:
        self.finished_at = datetime.now(timezone.utc)
        return self

    def as_row(self) -> dict[str, Any]:
        return dict(self.__dict__)


def describe(exc: BaseException) -> str:
    """An exception as an action row's error text."""
    return f"{type(exc).__name__}: {exc}"


def replace_in_segment(
    first_entry_id: int, mapping: Mapping[str, str]
) -> Any:  # Callable[[LedgerMetadata], LedgerMetadata | None]
    """CAS transform: swap old -> new in the segment keyed ``first_entry_id``; None (no write)
    when another actor already replaced every old bookie."""

    def transform(md: LedgerMetadata) -> LedgerMetadata | None:
        seg = next((s for s in md.segments if s.first_entry_id == first_entry_id), None)
        if seg is None:
            raise ReplicationError(
                f"segment {first_entry_id} vanished while repairing", ledger_id=md.ledger_id
            )
        todo = {old: new for old, new in mapping.items() if old in seg.ensemble}
        if not todo:
            return None
        clash = set(todo.values()) & set(seg.ensemble)
        if clash:
            raise ReplicationError(
                f"replacement {sorted(clash)} joined segment {first_entry_id} meanwhile",
                ledger_id=md.ledger_id,
            )
        return md.with_bookies_replaced(first_entry_id, todo)

    return transform


def recovery_swap(before: LedgerMetadata, after: LedgerMetadata) -> tuple[str, str] | None:
    """The (old, new) bookie a fencing recovery put into the ledger's last ensemble, comparing
    the metadata before recovery with the closed result; None when the ensemble is unchanged.
    Recovery changes one position at a time, so the first difference is the swap."""
    old_ensemble = before.segments[-1].ensemble
    new_ensemble = after.segments[-1].ensemble
    for old, new in zip(old_ensemble, new_ensemble, strict=False):
        if old != new:
            return old, new
    return None
