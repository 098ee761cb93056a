"""After a repair: make Pulsar's brokers drop their stale ledger handles (``--pulsar-admin-url``).

The topics behind the ledgers a run changed (read from each ledger's Pulsar custom
metadata), the unloads through the admin API (:mod:`bklib.pulsar.unload`), the
``UNLOAD_TOPIC`` rows in ``replication_actions``, and the lines the operator reads. Without
the URL the topics are named with the command that fixes them. See docs/pulsar.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from bklib.meta.pulsar import decode_pulsar_metadata
from bklib.meta.scan import read_ledgers_by_id
from bklib.meta.store import LedgerStore
from bklib.meta.stores import MetadataStore
from bklib.pulsar.admin import AdminSettings, PulsarAdmin
from bklib.pulsar.unload import (
    UnloadOutcome,
    ledgers_changed,
    operator_command,
    topics_awaiting_unload,
    topics_to_unload,
    unload_topics,
)
from bklib.states import ActionKind, ActionStatus

__all__ = [
    "Unloads",
    "outcome_rows",
    "report_unloads",
    "topics_of",
    "unload_changed_topics",
]

log = logging.getLogger("jobs.commands.repair")


def topics_of(
    session: MetadataStore, ledgers_root: str, ledger_ids: Iterable[int]
) -> dict[int, str | None]:
    """Each ledger's Pulsar topic, from its custom metadata (None: untagged, or deleted). Read
    pipelined (a loss of a bookie changes tens of thousands of ledgers; one read at a time took
    a quarter of a minute for 44,000)."""
    ids = sorted(set(ledger_ids))
    out: dict[int, str | None] = dict.fromkeys(ids)  # deleted since: no handle to refresh
    if not ids:
        return out
    kind = LedgerStore(session, ledgers_root).kind
    for read in read_ledgers_by_id(session, ids, root=ledgers_root, kind=kind):
        if read.metadata is None:  # unreadable: named, and no topic to unload
            log.info("ledger %d: no topic to unload (%s)", read.ledger_id, read.error)
            continue
        out[read.ledger_id] = decode_pulsar_metadata(read.metadata.custom_metadata).topic
    return out


def outcome_rows(
    outcomes: Sequence[UnloadOutcome], *, run_id: str, mode: str, audit_run_id: str | None
) -> list[dict[str, Any]]:
    """``replication_actions`` rows, one ``UNLOAD_TOPIC`` per topic (its first ledger in
    ``ledger_id``)."""

    def ts(t: float) -> datetime:
        return datetime.fromtimestamp(t, timezone.utc)

    return [
        {
            "run_id": run_id,
            "mode": mode,
            "audit_run_id": audit_run_id,
            "ledger_id": o.ledger_ids[0],
            "segment_first_entry_id": None,
            "segment_last_entry_id": None,
            "old_bookie": None,
            "new_bookie": None,
            "action": ActionKind.UNLOAD_TOPIC,
            "entries_copied": 0,
            "bytes_copied": 0,
            "no_replica_entries": None,
            "status": o.status,
            "error": o.error,
            "started_at": ts(o.started_at),
            "finished_at": ts(o.finished_at),
            "executor": None,
            "topic": o.topic,
        }
        for o in outcomes
    ]


@dataclass
class Unloads:
    """What one repair's unload step did: the topics planned, each one's outcome, and the
    ``UNLOAD_TOPIC`` rows to append to ``replication_actions``."""

    plan: dict[str, list[int]]
    outcomes: list[UnloadOutcome]
    rows: list[dict[str, Any]]


def unload_changed_topics(
    rows: Sequence[Mapping[str, Any]],
    *,
    run_id: str,
    mode: str,
    session: MetadataStore,
    ledgers_root: str,
    warehouse: str,
    audit_run_id: str | None,
    dry_run: bool,
    settings: AdminSettings | None,
    unload_rate: float,
) -> Unloads:
    """Unload the topics behind the ledgers a repair changed, and, with the admin API
    (``settings``), those earlier runs recorded as still waiting. Without it nothing is
    unloaded and the topics come back MANUAL: the operator's step, with its command. The
    rows are returned, not written: the repair commands append them at once, the watch
    through its spool."""
    changed = ledgers_changed(rows, dry_run=dry_run)
    plan = topics_to_unload(changed, topics_of(session, ledgers_root, changed))
    if settings is not None and not dry_run:
        for topic, lids in _left_by_earlier_runs(warehouse).items():
            plan.setdefault(topic, lids)
    if not plan:
        return Unloads({}, [], [])
    admin = PulsarAdmin(settings) if settings is not None else None
    outcomes = unload_topics(admin, plan, per_second=unload_rate, dry_run=dry_run)
    return Unloads(
        plan, outcomes, outcome_rows(outcomes, run_id=run_id, mode=mode, audit_run_id=audit_run_id)
    )


def report_unloads(
    done: Unloads, *, warehouse: str, dry_run: bool, settings: AdminSettings | None
) -> None:
    """A repair command's ending for :func:`unload_changed_topics`: the rows appended to
    ``replication_actions`` and the lines the operator reads."""
    from jobs.tables import delta
    from jobs.tables.schema import ACTIONS

    if not done.plan:
        return
    delta.append_rows(warehouse, ACTIONS, done.rows)
    if settings is None and not dry_run:
        print(
            f"  {len(done.plan)} Pulsar topics had ledgers repaired; their brokers may hold "
            "stale ledger handles until each is unloaded (or pass --pulsar-admin-url):"
        )
        for topic in done.plan:
            print(f"    {operator_command(topic)}")
        return
    ok = sum(o.status in (ActionStatus.DONE, ActionStatus.PLANNED) for o in done.outcomes)
    verb = "would unload" if dry_run else "unloaded"
    where = f" through {settings.url}" if settings is not None else ""
    print(f"  {verb} {ok} of {len(done.outcomes)} Pulsar topics{where}")
    failed = [o for o in done.outcomes if o.status == ActionStatus.FAILED]
    if failed:
        reasons = sorted({o.error or "" for o in failed})
        others = f"; {len(reasons) - 1} other errors" if len(reasons) > 1 else ""
        print(f"  {len(failed)} topics still need an unload ({reasons[0]}{others}):")
        for o in failed:
            print(f"    {operator_command(o.topic)}")


def _left_by_earlier_runs(warehouse: str) -> dict[str, list[int]]:
    """Topics earlier runs recorded as still needing an unload, each with the ledger its
    row named."""
    from jobs.tables import delta
    from jobs.tables.schema import ACTIONS

    if not delta.table_exists(warehouse, ACTIONS):
        return {}
    rows = delta.read_rows(
        warehouse,
        ACTIONS,
        columns=["ledger_id", "action", "status", "topic", "started_at"],
        filters=[("action", "=", ActionKind.UNLOAD_TOPIC)],
    )
    waiting = set(topics_awaiting_unload(rows))
    return {str(r["topic"]): [int(r["ledger_id"])] for r in rows if r["topic"] in waiting}
