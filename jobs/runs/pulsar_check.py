"""``bkaudit audit --check pulsar``: Pulsar's metadata against BookKeeper's ledgers.

Reads every managed ledger, cursor and schema (:mod:`bklib.pulsar.references`) and every
ledger's metadata, finds dangling references and orphan ledgers
(:mod:`bklib.pulsar.crosscheck`), re-reads each candidate's key and ledger before reporting it,
and writes the run to ``pulsar_checks`` and its findings to ``pulsar_references``. It runs in
this process whatever ``--executor`` says: it reads metadata only. See docs/pulsar.md.

Exit status: 0 when nothing was found, 1 with findings (or undecodable keys), 2 on error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bklib.audit.accounting import scanned_per_directory
from bklib.audit.engine import ScanPlan, require_cluster
from bklib.meta.pulsar import decode_pulsar_metadata
from bklib.meta.scan import read_ledgers_by_id
from bklib.meta.store import LedgerStore
from bklib.meta.stores import KeyNotFound, MetadataStore
from bklib.meta.stores.session_guard import SessionGuard
from bklib.pulsar.crosscheck import (
    BookKeeperLedger,
    Orphan,
    confirm_dangling,
    confirm_orphan,
    dangling_candidates,
    orphan_candidates,
)
from bklib.pulsar.metadata import CorruptPulsarMetadata
from bklib.pulsar.references import (
    Owner,
    PulsarMetadataMissing,
    PulsarReferences,
    Reference,
    read_references,
    references_in,
)
from bklib.pulsar.topics import InvalidTopicName, parse_topic
from bklib.states import PulsarFinding, RunStatus, Severity
from jobs.runtime.exit_status import ExitStatus, for_run_status, worst
from jobs.runtime.messages import one_line

__all__ = [
    "PulsarCheck",
    "add_pulsar_check_arguments",
    "check_pulsar",
    "listed_now",
    "pulsar_root_of",
    "run_pulsar_check",
]

log = logging.getLogger("jobs.commands.audit")

DEFAULT_ORPHAN_MIN_AGE = 24 * 3600.0


def add_pulsar_check_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of ``--check pulsar`` (and ``orphans``)."""
    from jobs.options.units import parse_duration

    parser.add_argument(
        "--orphan-min-age",
        type=parse_duration,
        default=DEFAULT_ORPHAN_MIN_AGE,
        help="check pulsar: an unlisted ledger is an orphan only when older than this "
        "(Pulsar creates a ledger before listing it; default 24h)",
    )
    parser.add_argument(
        "--pulsar-root",
        default=None,
        help="check pulsar: where Pulsar's managed-ledgers and schemas are (default: the "
        "parent of the ledgers root, as when Pulsar and BookKeeper share a store)",
    )
    return parser


def pulsar_root_of(ledgers_root: str) -> str:
    """Pulsar's metadata root when BookKeeper's shares its store: the ledgers root's parent."""
    parent = ledgers_root.rstrip("/").rsplit("/", 1)[0]
    return parent or "/"


@dataclass
class PulsarCheck:
    """One cross-check's outcome (see :func:`check_pulsar`)."""

    refs: PulsarReferences
    ledgers: int = 0
    unreadable_ledgers: int = 0
    scan_complete: bool = True
    scan_account: str = ""
    dangling: list[Reference] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)
    bookkeeper: dict[int, BookKeeperLedger] = field(default_factory=dict)
    """Every ledger the scan read (its tags, age, length and version)."""

    @property
    def status(self) -> str:
        if not self.scan_complete:
            return RunStatus.FAILED
        missed = self.refs.errors or self.unreadable_ledgers
        return RunStatus.COMPLETED_WITH_ERRORS if missed else RunStatus.COMPLETED

    def counts(self) -> dict[str, int]:
        return {
            "ledgers": self.ledgers,
            "unreadable_ledgers": self.unreadable_ledgers,
            "managed_ledgers": self.refs.managed_ledgers,
            "cursors": self.refs.cursors,
            "schemas": self.refs.schemas,
            "references": len(self.refs.refs),
            "dangling": len(self.dangling),
            "orphans": len(self.orphans),
            "orphan_bytes": sum(o.ledger.length or 0 for o in self.orphans),
            "errors": len(self.refs.errors),
        }


def _bookkeeper_ledgers(
    session: MetadataStore, root: str
) -> tuple[dict[int, BookKeeperLedger], int, bool, str]:
    """Every ledger's tags, creation time, length and version; (ledgers, unreadable, complete,
    account)."""
    plan = ScanPlan.read(session, root)
    out: dict[int, BookKeeperLedger] = {}
    unreadable = 0
    seen: list[str] = []
    store = LedgerStore(session, root, kind=plan.kind)

    def ids() -> Iterator[int]:
        for d in plan.dirs:
            yield from store.ledger_ids_in(d)

    for r in read_ledgers_by_id(session, ids(), root=root, kind=plan.kind):
        seen.append(r.path)
        if r.metadata is None:
            # Unreadable metadata names no owner we can trust: never judged an orphan,
            # and it exists, so no reference to it dangles.
            unreadable += 1
            out[r.ledger_id] = BookKeeperLedger(
                r.ledger_id, None, None, decode_pulsar_metadata({}), r.version
            )
            continue
        md = r.metadata
        out[r.ledger_id] = BookKeeperLedger(
            md.ledger_id,
            md.ctime,
            md.length,
            decode_pulsar_metadata(md.custom_metadata),
            r.version,
        )
    account = plan.account(session, scanned_per_directory(seen), root)
    return out, unreadable, account.complete, account.describe()


def listed_now(zk: MetadataStore, key: str, owner: str) -> tuple[frozenset[int] | None, bool]:
    """(ledgers ``key`` references now, None if it no longer decodes; whether it is gone),
    by the same rule as the walk (:func:`bklib.pulsar.references.references_in`)."""
    try:
        data: bytes = zk.get(key)[0]
    except KeyNotFound:
        return None, True
    kind = Owner.CURSOR if owner == Owner.COMPACTED else owner
    try:
        refs = references_in(key, kind, data, None)
    except CorruptPulsarMetadata:
        return None, False
    return frozenset(r.ledger_id for r in refs), False


def check_pulsar(
    zk: MetadataStore,
    ledgers_root: str,
    *,
    pulsar_root: str | None = None,
    orphan_min_age: float = DEFAULT_ORPHAN_MIN_AGE,
    before_confirm: Callable[[], None] | None = None,
) -> PulsarCheck:
    """Cross-check Pulsar's metadata and BookKeeper's (both read over the command's session
    ``zk``): read Pulsar's references, scan the ledgers, pick candidates, and keep those a
    fresh read confirms. ``before_confirm`` runs between the two (tests use it to change the
    cluster there, as a broker may)."""
    root = pulsar_root or pulsar_root_of(ledgers_root)
    refs = read_references(zk, root)
    bk, unreadable, complete, account = _bookkeeper_ledgers(zk, ledgers_root)
    check = PulsarCheck(refs, len(bk), unreadable, complete, account)
    check.bookkeeper = bk
    tagged = sum(1 for led in bk.values() if led.tags.managed_ledger)
    if refs.managed_ledgers == 0 and tagged:
        # Pulsar's ledgers without Pulsar's metadata: the wrong root, not a cluster whose
        # every topic is gone. Judging them would call every ledger an orphan.
        raise PulsarMetadataMissing(
            f"{tagged} ledgers are tagged for Pulsar topics but {root} has no managed "
            "ledgers: give --pulsar-root (where managed-ledgers is)"
        )
    store = LedgerStore(zk, ledgers_root)
    if before_confirm is not None:
        before_confirm()
    for ref in dangling_candidates(refs, bk.__contains__):
        listed, _ = listed_now(zk, ref.key, ref.owner)
        exists = zk.exists(store.path_for(ref.ledger_id)) is not None
        if confirm_dangling(ref, listed, exists):
            check.dangling.append(ref)
        else:
            log.info("ledger %d of %s: no longer dangling on a re-read", ref.ledger_id, ref.key)
    now_ms = int(time.time() * 1000)
    for orphan in orphan_candidates(
        refs, bk, root=root, now_ms=now_ms, min_age_ms=int(orphan_min_age * 1000)
    ):
        listed, gone = listed_now(zk, orphan.owner_key, orphan.owner)
        still = zk.exists(store.path_for(orphan.ledger.ledger_id)) is not None
        if still and confirm_orphan(orphan, listed, gone):
            check.orphans.append(orphan)
    return check


def _namespace(topic: str | None) -> str | None:
    if not topic:
        return None
    try:
        return parse_topic(topic).namespace_name
    except InvalidTopicName:
        return None


def finding_rows(check: PulsarCheck, run_id: str, at: datetime) -> list[dict[str, Any]]:
    """``pulsar_references`` rows: dangling, orphans, then undecodable keys."""
    rows: list[dict[str, Any]] = []

    def row(kind: str, **kw: Any) -> None:
        base: dict[str, Any] = {
            "run_id": run_id,
            "detected_at": at,
            "kind": kind,
            "severity": None,
            "ledger_id": None,
            "topic": None,
            "namespace": None,
            "component": None,
            "key": None,
            "bytes": None,
            "ledger_ctime": None,
            "error": None,
        }
        base.update(kw)
        base["namespace"] = _namespace(base["topic"])
        rows.append(base)

    for ref in check.dangling:
        row(
            PulsarFinding.DANGLING,
            severity=Severity.NO_REPLICA,
            ledger_id=ref.ledger_id,
            topic=ref.topic,
            component=ref.owner,
            key=ref.key,
            error=f"{ref.key} references ledger {ref.ledger_id}, which BookKeeper does not have",
        )
    for o in check.orphans:
        ctime = o.ledger.ctime_ms
        row(
            PulsarFinding.ORPHAN,
            ledger_id=o.ledger.ledger_id,
            topic=o.ledger.tags.topic,
            component=o.owner,
            key=o.owner_key,
            bytes=o.ledger.length,
            ledger_ctime=datetime.fromtimestamp(ctime / 1000, timezone.utc) if ctime else None,
        )
    for key, reason in sorted(check.refs.errors.items()):
        row(PulsarFinding.ERROR, key=key, error=reason)
    return rows


def run_pulsar_check(
    args: argparse.Namespace, session: MetadataStore, run_id: str | None = None
) -> int:
    """Run the cross-check from ``audit``'s parsed arguments, write it, print a summary."""
    from jobs.tables import delta
    from jobs.tables.runs import new_run_id
    from jobs.tables.schema import PULSAR_CHECKS, PULSAR_REFERENCES

    started = datetime.now(timezone.utc)
    run_id = run_id or getattr(args, "run_id", None) or new_run_id(started)
    root = args.pulsar_root or pulsar_root_of(args.ledgers_root)
    record: dict[str, Any] = {
        "run_id": run_id,
        "started_at": started,
        "zk": args.zk,
        "pulsar_root": root,
        "counts": None,
        "error": None,
    }
    try:
        delta.check_writable(args.warehouse, (PULSAR_CHECKS, PULSAR_REFERENCES))
        require_cluster(session, args.ledgers_root)
    except Exception as exc:  # before any work: an operator error, one line, nothing recorded
        log.debug("pulsar check could not start", exc_info=True)
        print(f"audit: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    try:
        with SessionGuard(session) as guard:
            check = check_pulsar(
                session,
                args.ledgers_root,
                pulsar_root=root,
                orphan_min_age=args.orphan_min_age,
            )
            guard.check("the Pulsar cross-check")  # nothing judged from a read across a gap
    except Exception as exc:  # one line for the operator, and a FAILED run on record
        log.debug("pulsar check failed", exc_info=True)
        print(f"audit: {one_line(exc)}", file=sys.stderr)
        record.update(status=RunStatus.FAILED, error=one_line(exc), finished_at=_now())
        try:
            delta.append_rows(args.warehouse, PULSAR_CHECKS, [record])
        except Exception:  # the warehouse itself may be what failed; the line above says why
            log.debug("could not record the failed run", exc_info=True)
        # A wrong --pulsar-root is the operator's to fix; anything else stopped a started run.
        missing_root = isinstance(exc, PulsarMetadataMissing)
        return ExitStatus.OPERATOR_ERROR if missing_root else ExitStatus.INCOMPLETE
    at = _now()
    rows = finding_rows(check, run_id, at)
    if rows:
        delta.append_rows(args.warehouse, PULSAR_REFERENCES, rows)
    error = None if check.scan_complete else f"metadata scan incomplete: {check.scan_account}"
    record.update(status=check.status, counts=check.counts(), error=error, finished_at=_now())
    delta.append_rows(args.warehouse, PULSAR_CHECKS, [record])
    _print_summary(run_id, check)
    if check.status == RunStatus.FAILED:
        print(f"audit: {error}; run the check again", file=sys.stderr)
    elif check.status != RunStatus.COMPLETED:
        print(
            f"audit: pulsar check {run_id} is incomplete: {check.refs.errors} undecodable "
            f"Pulsar keys, {check.unreadable_ledgers} unreadable ledger znodes",
            file=sys.stderr,
        )
    return worst(
        for_run_status(check.status),
        ExitStatus.FINDINGS if (check.dangling or check.orphans) else ExitStatus.OK,
    )


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _print_summary(run_id: str, check: PulsarCheck) -> None:
    c = check.counts()
    print(
        f"pulsar check {run_id} ({check.status}): {c['managed_ledgers']} managed ledgers, "
        f"{c['cursors']} cursors, {c['schemas']} schemas, {c['ledgers']} BookKeeper ledgers; "
        f"{c['dangling']} dangling, {c['orphans']} orphans ({c['orphan_bytes'] / 1e6:.1f} MB), "
        f"{c['errors']} undecodable keys"
    )
    for ref in check.dangling:
        print(f"  DANGLING ledger {ref.ledger_id}: {ref.owner} {ref.key} ({ref.topic})")
    for o in check.orphans:
        print(
            f"  ORPHAN   ledger {o.ledger.ledger_id}: {o.ledger.length or 0} bytes, not listed "
            f"by {o.owner} {o.owner_key}"
        )
    for key, reason in sorted(check.refs.errors.items()):
        print(f"  ERROR    {key}: {reason}")
