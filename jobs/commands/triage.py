"""``bkaudit triage``: why each unrecoverable ledger cannot be repaired.

    bkaudit triage --warehouse W [--zk HOST:PORT[/chroot]]

The ledgers triaged are those of the latest audit with a NO_REPLICA fragment, and those whose
repair since that audit is stuck (FAILED or NO_REPLICA), unless a later repair resolved them.
Each gets a class (:mod:`bklib.audit.triage`), its Pulsar topic, and its age, in the ``triage``
table and on stdout. With ``--zk`` the metadata, registrations and racks are read now (a
deleted ledger is DELETED); without it the audit's own ``ledgers`` and ``bookies`` rows are
used. Exit status: 0 nothing to triage, 1 ledgers triaged, 2 on error.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

from bklib.audit.completeness import incomplete_line
from bklib.audit.model import LedgerView, runs_from_rows, runs_to_rows
from bklib.audit.triage import triage_ledger
from bklib.errors import BKError
from bklib.meta.racks import DEFAULT_RACKS_ZNODE, read_racks
from bklib.meta.stores import MetadataStore, open_store
from bklib.states import (
    DEFAULT_LEDGERS_ROOT,
    ActionStatus,
    BookieState,
    Reason,
    Severity,
)
from bklib.tls import TlsSettings
from jobs.options.warehouse import WAREHOUSE_HELP
from jobs.runtime.exit_status import ExitStatus, for_run_status, worst
from jobs.runtime.messages import one_line

__all__ = ["add_triage_arguments", "collect_triage", "run_triage"]

log = logging.getLogger("jobs.commands.triage")

STUCK = (ActionStatus.FAILED, ActionStatus.NO_REPLICA)
"""Repair outcomes that leave a ledger to triage."""


def add_triage_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``bkaudit triage`` flags."""
    parser.add_argument("--warehouse", required=True, help=WAREHOUSE_HELP)
    parser.add_argument(
        "--zk", default=None, help="read the metadata now (finds deleted ledgers); optional"
    )
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    parser.add_argument("--racks-znode", default=DEFAULT_RACKS_ZNODE, help="Pulsar's racks")
    parser.add_argument("--run-id", default=None, help="id for this run (default: time + random)")
    from jobs.options.zookeeper import add_connection_arguments

    return add_connection_arguments(parser)


def _ts(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, timezone.utc) if ms else None


def collect_triage(
    warehouse: str,
    *,
    session: MetadataStore | None = None,
    root: str = DEFAULT_LEDGERS_ROOT,
    racks_znode: str = DEFAULT_RACKS_ZNODE,
    run_id: str | None = None,
    tls: TlsSettings | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The triage rows (TRIAGE_SCHEMA) and the audit run (its ``audit_runs`` row) they come
    from. With the command's
    store ``session`` the metadata is read now, and a Pulsar data ledger's lost entries are
    also named as message ids, with the publish-time range the surviving neighbours bound
    (:func:`pulsar_loss`)."""
    from bklib.repair.outcome import RESOLVED, repair_status
    from jobs.tables import delta
    from jobs.tables.runs import new_run_id
    from jobs.tables.schema import ACTIONS, BOOKIES, LEDGERS

    now = datetime.now(timezone.utc)
    run_id = run_id or new_run_id(now)
    run = delta.latest_run(warehouse)
    if run is None:
        raise RuntimeError(f"no completed audit run in {warehouse}")
    frags = delta.run_fragments(warehouse, run)
    by_ledger: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for f in frags:
        by_ledger[f["ledger_id"]].append(f)
    actions = []
    if by_ledger and delta.table_exists(warehouse, ACTIONS):
        actions = delta.read_rows(
            warehouse, ACTIONS, filters=[("ledger_id", "in", sorted(by_ledger))]
        )
    repairs = repair_status(actions, run["started_at"])
    wanted = sorted(
        lid
        for lid, fs in by_ledger.items()
        if repairs.get(lid, ("",))[0] not in RESOLVED
        and (
            any(f["severity"] == Severity.NO_REPLICA for f in fs)
            or repairs.get(lid, ("",))[0] in STUCK
        )
    )
    if not wanted:
        return [], run
    views: dict[int, LedgerView | None]
    racks: dict[str, str] = {}
    if session is not None:
        from bklib.audit.engine import read_ledgers
        from bklib.meta.registration import list_bookies

        views = read_ledgers(session, wanted, root=root)
        writable = set(list_bookies(session, root).writable)
        racks = read_racks(session, racks_znode)
    else:
        rows = delta.read_rows(
            warehouse,
            LEDGERS,
            filters=[("run_id", "=", run["run_id"]), ("ledger_id", "in", wanted)],
        )
        views = {lid: None for lid in wanted}
        views.update({r["ledger_id"]: LedgerView.from_row(r) for r in rows})
        writable = {
            r["bookie_id"]
            for r in delta.read_rows(warehouse, BOOKIES, filters=[("run_id", "=", run["run_id"])])
            if r["state"] == BookieState.WRITABLE
        }
    out = []
    for lid in wanted:
        fs = by_ledger[lid]
        missing: dict[tuple[int, str], tuple[tuple[int, int], ...] | None] = {}
        for f in fs:
            if f["reason"] == Reason.BOOKIE_UNREACHABLE:
                continue  # unknown is never missing (docs/safety-rules.md rule 1)
            key = (f["segment_first_entry_id"], f["bookie_id"])
            ranges: tuple[tuple[int, int], ...] | None = (
                None
                if f["reason"] == Reason.BOOKIE_LOST or f.get("missing_ranges_truncated")
                else tuple(runs_from_rows(f.get("missing_ranges")))
            )
            prev = missing.get(key, ())
            missing[key] = None if ranges is None or prev is None else (*prev, *ranges)
        status, last = repairs.get(lid, (None, {}))
        view = views.get(lid)
        res = triage_ledger(
            view, missing, writable=writable, racks=racks, repair_error=last.get("error")
        )
        first = fs[0]
        ctime = _ts(view.ctime) if view is not None else None
        loss = PulsarLoss()
        if session is not None and view is not None and res.lost_ranges:
            try:
                loss = pulsar_loss(
                    session, root, tls, view, res.lost_ranges, res.lost_ranges_truncated
                )
            except (BKError, OSError) as exc:  # optional detail: the class stands
                log.warning("ledger %d: lost messages not named: %s", lid, exc)
        detected = [f["first_detected_at"] for f in fs if f.get("first_detected_at")]
        out.append(
            {
                "run_id": run_id,
                "triaged_at": now,
                "audit_run_id": run["run_id"],
                "ledger_id": lid,
                "class": res.klass,
                "detail": res.detail,
                "topic": (view.topic if view is not None else None) or first.get("topic"),
                "component": (view.component if view is not None else None)
                or first.get("component"),
                "ledger_state": view.state if view is not None else first.get("ledger_state"),
                "ensemble_size": first.get("ensemble_size"),
                "write_quorum": first.get("write_quorum"),
                "ack_quorum": first.get("ack_quorum"),
                "lost_entries": res.lost_entries,
                "lost_ranges": runs_to_rows(res.lost_ranges),
                "lost_ranges_truncated": res.lost_ranges_truncated,
                "ctime": ctime,
                "age_seconds": int((now - ctime).total_seconds()) if ctime else None,
                "first_detected_at": min(detected) if detected else None,
                "repair_status": status,
                "lost_message_ids": loss.message_ids,
                "lost_published_after": _ts(loss.after_ms),
                "lost_published_before": _ts(loss.before_ms),
            }
        )
    return out, run


@dataclass(frozen=True)
class PulsarLoss:
    """A Pulsar data ledger's lost messages: their ids, and the publish times of the nearest
    surviving entries around them (None: not a data ledger, or no neighbour read)."""

    message_ids: str | None = None
    after_ms: int | None = None
    before_ms: int | None = None


def pulsar_loss(
    session: MetadataStore,
    root: str,
    tls: TlsSettings | None,
    view: LedgerView,
    lost: Sequence[tuple[int, int]],
    truncated: bool = False,
) -> PulsarLoss:
    """Name the lost entries of a Pulsar topic's data ledger as message ids (``L:E``) and read
    the entries just before and after them for the publish-time range. A cursor, schema or
    untagged ledger holds no messages: nothing is named. A neighbour that cannot be read
    leaves its end of the range unknown, as does a ``truncated`` list of ranges for the end
    past the last one listed."""
    from bklib.client.pool import SyncBookieClient
    from bklib.client.reader import read_entries_blocking
    from bklib.meta.pulsar import COMPONENT_MANAGED_LEDGER, decode_pulsar_metadata
    from bklib.meta.store import LedgerStore
    from bklib.pulsar.messages import format_message_ids, publish_time

    store = LedgerStore(session, root)
    try:
        md = store.read_ledger(view.ledger_id).value
    except BKError:
        return PulsarLoss()
    tags = decode_pulsar_metadata(md.custom_metadata)
    if tags.component != COMPONENT_MANAGED_LEDGER or tags.cursor or not tags.managed_ledger:
        return PulsarLoss()
    ids = format_message_ids(view.ledger_id, lost) + (", and more" if truncated else "")
    last = md.last_entry_id if md.is_closed else None
    before_first = lost[0][0] - 1
    after_last = -1 if truncated else lost[-1][1] + 1
    times: dict[int, int | None] = {}
    with SyncBookieClient(session, ledgers_root=root, tls=tls) as bookies:
        for entry in (before_first, after_last):
            if entry < 0 or (last is not None and entry > last):
                continue
            try:
                (got,) = read_entries_blocking(bookies, store, view.ledger_id, entry, entry)
            except BKError as exc:
                log.info("ledger %d entry %d: unreadable (%s)", view.ledger_id, entry, exc)
                continue
            times[entry] = publish_time(got.payload)
    return PulsarLoss(ids, times.get(before_first), times.get(after_last))


def _age(seconds: int | None) -> str:
    if seconds is None:
        return "age ?"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"age {seconds // n}{unit}"
    return f"age {seconds}s"


def run_triage(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point (``bkaudit triage``)."""
    from jobs.tables import delta
    from jobs.tables.schema import TRIAGE

    stream = out or sys.stdout
    try:
        with contextlib.ExitStack() as stack:
            # The command's one session, when it reads the metadata now (--zk).
            session = (
                stack.enter_context(open_store(args.zk, auth=args.zk_auth)) if args.zk else None
            )
            rows, run = collect_triage(
                args.warehouse,
                session=session,
                root=args.ledgers_root,
                racks_znode=args.racks_znode,
                run_id=args.run_id,
                tls=getattr(args, "bookie_tls", None),
            )
        if rows:
            delta.append_rows(args.warehouse, TRIAGE, rows)
    except Exception as exc:
        log.debug("triage failed", exc_info=True)
        print(f"triage: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    for r in rows:
        print(
            f"{r['ledger_id']}\t{r['class']}\t{r['topic'] or '-'}\t{_age(r['age_seconds'])}"
            f"\t{r['detail']}",
            file=stream,
        )
        if r["lost_message_ids"]:
            after, before = r["lost_published_after"], r["lost_published_before"]
            span = (
                f"published after {after.isoformat() if after else '?'} and before "
                f"{before.isoformat() if before else '?'}"
            )
            print(f"\tlost messages {r['lost_message_ids']}; {span}", file=stream)
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r["class"]] += 1
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing to triage"
    print(f"triage of audit {run['run_id']}: {len(rows)} ledgers ({summary})", file=stream)
    missed = incomplete_line(run)
    if missed is not None:  # ledgers that audit could not read may need triage too
        print(missed, file=stream)
    return worst(ExitStatus.FINDINGS if rows else ExitStatus.OK, for_run_status(run["status"]))
