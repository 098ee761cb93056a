"""``bkaudit orphans delete``: delete the ledgers Pulsar no longer lists, safely.

    bkaudit orphans delete --zk HOST:PORT[/chroot] --warehouse W --older-than 7d [--dry-run]

Two full cross-checks (:func:`jobs.runs.pulsar_check.check_pulsar`) are read ``--delay`` apart; a
ledger is deleted only when both found it orphaned, its metadata did not change between them,
and a last read of its owner, just before the delete, still does not list it. The delete is
BookKeeper's: the metadata znode is removed by compare-and-set on the version both reads saw
(``BookKeeper.deleteLedger``); the bookies reclaim the entries at their next garbage
collection. A ledger without Pulsar's tags is never deleted unless ``--include-unowned`` is
given, and then only when no Pulsar key failed to decode in either read. A run whose ledger
scan was incomplete deletes nothing. Every deletion (or planned one) is a ``DELETE_ORPHAN``
row in ``replication_actions``; at most ``--rate`` ledgers are deleted a second.
See docs/pulsar.md.

Exit status (docs/exit-status.md): 0 when every agreed orphan was deleted (or planned), 1 when
some were not, 2 on an operator error, 3 when a read missed part of the cluster (an incomplete
scan deletes nothing; an unreadable ledger or an undecodable Pulsar key leaves what it may own
unjudged, said on the last line) or the session was lost (nothing more is deleted).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from bklib.errors import BKError, IncompleteReadError
from bklib.meta.pulsar import decode_pulsar_metadata
from bklib.meta.store import LedgerStore
from bklib.meta.stores import MetadataStore, open_store
from bklib.meta.stores.session_guard import SessionGuard
from bklib.pulsar.crosscheck import BookKeeperLedger, Orphan, confirm_orphan
from bklib.states import DEFAULT_LEDGERS_ROOT, ActionKind, ActionStatus, RepairMode
from jobs.options.warehouse import WAREHOUSE_HELP
from jobs.runs.pulsar_check import PulsarCheck, check_pulsar, listed_now, pulsar_root_of
from jobs.runtime.exit_status import ExitStatus, for_error, worst
from jobs.runtime.messages import one_line

__all__ = ["add_orphans_arguments", "agreed_orphans", "run_orphans"]

log = logging.getLogger("jobs.commands.orphans")

MIN_AGE = 3600.0
"""The youngest ledger ``--older-than`` may delete: Pulsar lists a ledger only after creating
it, and retries a failed listing; an hour is far past any such window."""

UNOWNED = "unowned"
"""The owner of a ledger without Pulsar's tags (``--include-unowned``)."""


def add_orphans_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from jobs.options.units import parse_duration

    parser.add_argument("action", choices=["delete"], help="what to do with the orphans")
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[/chroot]")
    parser.add_argument("--warehouse", required=True, help=WAREHOUSE_HELP)
    parser.add_argument(
        "--older-than",
        type=parse_duration,
        required=True,
        help="delete only orphans created longer ago than this (e.g. 7d)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="record what would be deleted; delete nothing"
    )
    parser.add_argument(
        "--include-unowned",
        action="store_true",
        help="also delete old ledgers without Pulsar's tags that no Pulsar key references "
        "(other applications' ledgers look the same: be sure)",
    )
    parser.add_argument(
        "--delay",
        type=parse_duration,
        default=30.0,
        help="time between the two reads that must agree (default 30s)",
    )
    parser.add_argument(
        "--rate", type=float, default=10.0, help="ledgers deleted per second at most"
    )
    parser.add_argument(
        "--pulsar-root",
        default=None,
        help="where Pulsar's managed-ledgers and schemas are (default: the ledgers root's parent)",
    )
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    from jobs.options.zookeeper import add_connection_arguments, add_session_timeout_argument

    add_session_timeout_argument(
        parser, default=30.0, effect="a pause longer than this stops the run (exit 3)"
    )
    return add_connection_arguments(parser)


def _unowned(check: PulsarCheck, bk: dict[int, BookKeeperLedger], min_age_ms: int) -> list[Orphan]:
    """Old ledgers without any Pulsar tag that no Pulsar key references."""
    referenced = {r.ledger_id for r in check.refs.refs}
    now = int(time.time() * 1000)
    return [
        Orphan(led, "", UNOWNED)
        for lid, led in sorted(bk.items())
        if lid not in referenced
        and led.tags == decode_pulsar_metadata({})
        and led.ctime_ms is not None
        and now - led.ctime_ms >= min_age_ms
    ]


def agreed_orphans(first: Sequence[Orphan], second: Sequence[Orphan]) -> list[Orphan]:
    """The orphans both reads found, with unchanged metadata (same znode version)."""
    before = {o.ledger.ledger_id: o.ledger.version for o in first}
    return [
        o
        for o in second
        if o.ledger.ledger_id in before and before[o.ledger.ledger_id] == o.ledger.version
    ]


def _read(
    args: argparse.Namespace, session: MetadataStore, root: str
) -> tuple[PulsarCheck, list[Orphan]]:
    check = check_pulsar(
        session,
        args.ledgers_root,
        pulsar_root=root,
        orphan_min_age=args.older_than,
    )
    if not check.scan_complete:
        raise IncompleteReadError(
            f"metadata scan incomplete ({check.scan_account}); nothing deleted"
        )
    found = list(check.orphans)
    if args.include_unowned:
        if check.refs.errors:
            raise IncompleteReadError(
                f"{len(check.refs.errors)} Pulsar keys could not be decoded (e.g. "
                f"{next(iter(sorted(check.refs.errors)))}): with --include-unowned nothing is "
                "deleted, as such a key may reference any ledger"
            )
        found += _unowned(check, check.bookkeeper, int(args.older_than * 1000))
    return check, found


def run_orphans(args: argparse.Namespace) -> int:
    """``bkaudit orphans delete``: read twice, delete what both reads agree on."""
    from jobs.tables import delta
    from jobs.tables.runs import new_run_id
    from jobs.tables.schema import ACTIONS

    run_id = new_run_id(datetime.now(timezone.utc))
    root = args.pulsar_root or pulsar_root_of(args.ledgers_root)
    if args.older_than < MIN_AGE:
        print(
            f"orphans: --older-than must be at least {MIN_AGE / 3600:g}h: Pulsar creates a "
            "ledger before it lists it",
            file=sys.stderr,
        )
        return ExitStatus.OPERATOR_ERROR
    from jobs.runtime.startup import check_before_connecting

    try:
        check_before_connecting(args)  # the warehouse, in one line, before the store
        delta.check_writable(args.warehouse, (ACTIONS,))
        session = open_store(  # the command's one session
            args.zk, auth=args.zk_auth, session_timeout=args.zk_session_timeout
        )
    except Exception as exc:  # one line for the operator; nothing was read
        log.debug("orphans could not start", exc_info=True)
        print(f"orphans: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    with session, SessionGuard(session) as guard:
        return _run_with(args, session, guard, root, run_id)


def _run_with(
    args: argparse.Namespace, session: MetadataStore, guard: SessionGuard, root: str, run_id: str
) -> ExitStatus:
    from bklib.audit.engine import require_cluster
    from jobs.tables import delta
    from jobs.tables.schema import ACTIONS

    try:
        require_cluster(session, args.ledgers_root)
        first_check, first = _read(args, session, root)
        guard.check("the first read")  # one view of the cluster, or none
        log.info("orphans: %d found; reading again in %gs", len(first), args.delay)
        time.sleep(args.delay)
        second_check, second = _read(args, session, root)
        guard.check("the second read")
    except Exception as exc:  # one line for the operator; nothing was deleted
        log.debug("orphans failed", exc_info=True)
        print(f"orphans: {one_line(exc)}", file=sys.stderr)
        return for_error(exc)
    agreed = agreed_orphans(first, second)
    rows: list[dict[str, Any]] = []
    try:
        _delete(args, session, guard, agreed, run_id, rows)
    except Exception as exc:  # the store lost mid-way: what was deleted is still recorded
        log.debug("orphans stopped", exc_info=True)
        print(f"orphans: stopped after {len(rows)} ledgers: {one_line(exc)}", file=sys.stderr)
        return for_error(exc)
    finally:
        if rows:
            delta.append_rows(args.warehouse, ACTIONS, rows)
    done = [r for r in rows if r["status"] in (ActionStatus.DONE, ActionStatus.PLANNED)]
    freed = sum(
        o.ledger.length or 0 for o in agreed if o.ledger.ledger_id in {r["ledger_id"] for r in done}
    )
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"orphans {run_id}: {len(first)} and {len(second)} orphans in the two reads, "
        f"{len(agreed)} agreed; {verb} {len(done)} ({freed / 1e6:.1f} MB)"
    )
    for r in rows:
        print(
            f"  ledger {r['ledger_id']:<12} {r['status']:<8} {r['topic'] or '-'} {r['error'] or ''}"
        )
    unjudged = _unjudged(first_check, second_check)
    if unjudged:  # what could not be read may be an orphan too: never a clean run
        print(f"INCOMPLETE: not judged, {unjudged}")
    return worst(
        ExitStatus.OK if len(done) == len(agreed) else ExitStatus.FINDINGS,
        ExitStatus.INCOMPLETE if unjudged else ExitStatus.OK,
    )


def _unjudged(*checks: PulsarCheck) -> str:
    """What the reads could not judge (unreadable ledgers, Pulsar keys that do not decode and
    so the ledgers they own), as one clause; "" when they judged everything."""
    ledgers = max(c.unreadable_ledgers for c in checks)
    keys = sorted({k for c in checks for k in c.refs.errors})
    parts = []
    if ledgers:
        parts.append(f"{ledgers} ledgers whose metadata could not be read")
    if keys:
        parts.append(f"the ledgers of {len(keys)} Pulsar keys that do not decode (e.g. {keys[0]})")
    return "; ".join(parts)


def _delete(
    args: argparse.Namespace,
    zk: MetadataStore,
    guard: SessionGuard,
    orphans: Sequence[Orphan],
    run_id: str,
    rows: list[dict[str, Any]],
) -> None:
    """Delete each orphan (or plan it), appending its row to ``rows`` as it goes."""
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    store = LedgerStore(zk, args.ledgers_root)
    for o in orphans:
        # A lost session may have let the cluster change unseen: no delete after it.
        guard.check(f"deleting ledger {o.ledger.ledger_id}")
        started = datetime.now(timezone.utc)
        lid = o.ledger.ledger_id
        status, error = ActionStatus.PLANNED, None
        if o.owner != UNOWNED:
            listed, gone = listed_now(zk, o.owner_key, o.owner)
            if not confirm_orphan(o, listed, gone):
                status, error = (
                    ActionStatus.SKIPPED,
                    f"{o.owner_key} lists it again, or no longer decodes",
                )
        if status == ActionStatus.PLANNED and not args.dry_run:
            try:
                store.delete_ledger(
                    lid, version=o.ledger.version if o.ledger.version is not None else -1
                )
                status = ActionStatus.DONE
                log.info(
                    "ledger %d: orphan of %s deleted (%d bytes)",
                    lid,
                    o.owner_key or UNOWNED,
                    o.ledger.length or 0,
                )
            except BKError as exc:  # changed since both reads: left alone
                status, error = ActionStatus.FAILED, str(exc)
            time.sleep(interval)
        rows.append(
            {
                "run_id": run_id,
                "mode": RepairMode.ORPHANS,
                "audit_run_id": None,
                "ledger_id": lid,
                "segment_first_entry_id": None,
                "segment_last_entry_id": None,
                "old_bookie": None,
                "new_bookie": None,
                "action": ActionKind.DELETE_ORPHAN,
                "entries_copied": 0,
                "bytes_copied": 0,
                "no_replica_entries": None,
                "status": status,
                "error": error,
                "started_at": started,
                "finished_at": datetime.now(timezone.utc),
                "executor": None,
                "topic": o.ledger.tags.topic,
            }
        )
