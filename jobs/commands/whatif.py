"""``bkaudit whatif``: may these bookies (or this rack) stop now? From the current metadata
and the latest audit.

    bkaudit whatif --zk HOST:PORT[/chroot] (--bookie B[,C...] | --rack R) [--warehouse W]
                   [--exit-code]

It reads every ledger's metadata in-process (:func:`bklib.audit.engine.scan_dirs`), the bookie
registrations (a bookie named in an ensemble but not registered is already lost), Pulsar's rack
document (``/bookies``), and with ``--warehouse`` the latest audit's findings: replicas found
missing count as gone, unless a repair since resolved their ledger. The arithmetic is
:mod:`bklib.audit.whatif` (docs/whatif.md). :func:`load_state` is shared with ``bkaudit
blastradius`` (:mod:`jobs.commands.blastradius`), which asks the same of every bookie and rack.

Exit status: with ``--exit-code`` 0 SAFE, 1 UNSAFE; without it 0 either way (the verdict is
always printed); 2 on error (an unknown bookie or rack, an unparsable rack document, no
cluster).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from bklib.audit.accounting import scanned_per_directory
from bklib.audit.engine import ScanPlan, scan_dirs
from bklib.audit.model import LedgerView, named_bookies, runs_from_rows
from bklib.audit.whatif import (
    LedgerImpact,
    ScanCoverage,
    WriterCheck,
    current_missing,
    ledger_impact,
)
from bklib.meta.racks import (
    DEFAULT_RACKS_ZNODE,
    RacksFormatError,
    read_racks,
    read_racks_strict,
)
from bklib.meta.registration import BookieRegistry, list_bookies
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.session_guard import SessionGuard
from bklib.replacement import DEFAULT_MIN_RACKS, rack_of
from bklib.states import (
    DEFAULT_LEDGERS_ROOT,
    UNKNOWN_RACK,
    BookieState,
    Reason,
    Verdict,
)
from jobs.runtime.exit_status import ExitStatus, for_error, worst
from jobs.runtime.gc_pause import paused_gc
from jobs.runtime.messages import one_line
from jobs.runtime.startup import open_command_store

__all__ = [
    "ClusterState",
    "Findings",
    "UsageError",
    "add_whatif_arguments",
    "findings_missing",
    "load_state",
    "read_cluster",
    "run_whatif",
]

log = logging.getLogger("jobs.commands.whatif")


class UsageError(RuntimeError):
    """A one-line error for the user (exit 2)."""


@dataclass
class ClusterState:
    """What the what-if arithmetic needs, read once."""

    views: list[LedgerView]
    writable: frozenset[str]
    readonly: frozenset[str]
    lost: frozenset[str]
    racks: dict[str, str]
    missing: dict[tuple[int, int, str], Sequence[tuple[int, int]] | None] = field(
        default_factory=dict
    )
    audit_run_id: str | None = None
    unaccounted: int = 0
    """Announced ledgers the metadata scan did not account for (docs/reliability.md)."""

    @property
    def unreadable(self) -> list[LedgerView]:
        """Ledgers whose metadata could not be read: they may name any bookie."""
        return [v for v in self.views if not v.ok]

    @property
    def coverage(self) -> ScanCoverage:
        """What the scan could not read or account for."""
        return ScanCoverage.of([v.ledger_id for v in self.unreadable], self.unaccounted)

    @property
    def bookies(self) -> list[str]:
        """Every bookie: registered ones, then lost ones."""
        return sorted(self.writable | self.readonly) + sorted(self.lost)


Findings = dict[tuple[int, int, str], tuple[tuple[int, int], ...] | None]


def findings_missing(warehouse: str) -> tuple[Findings, str]:
    """Replicas the latest audit found missing, on ledgers no repair has resolved since, and
    the audit's run id. Unreachable replicas count as missing (whatif is conservative); a
    truncated range list counts as the whole stripe. Keep only those the current metadata
    still names (:func:`bklib.audit.whatif.current_missing`)."""
    from bklib.repair.outcome import RESOLVED, repair_status
    from jobs.tables import delta
    from jobs.tables.schema import ACTIONS

    run = delta.latest_run(warehouse)
    if run is None:
        raise UsageError(f"no completed audit run in {warehouse}")
    frags = delta.run_fragments(warehouse, run)
    wanted = sorted({f["ledger_id"] for f in frags})
    actions = []
    if wanted and delta.table_exists(warehouse, ACTIONS):
        actions = delta.read_rows(warehouse, ACTIONS, filters=[("ledger_id", "in", wanted)])
    resolved = {
        lid for lid, (status, _) in repair_status(actions, run["started_at"]).items()
        if status in RESOLVED
    }  # fmt: skip
    out: Findings = {}
    for f in frags:
        key = (f["ledger_id"], f["segment_first_entry_id"], f["bookie_id"])
        if f["ledger_id"] in resolved:
            continue
        ranges: tuple[tuple[int, int], ...] | None
        if f["reason"] in Reason.WHOLE_BOOKIE or f.get("missing_ranges_truncated"):
            ranges = None
        else:
            ranges = tuple(runs_from_rows(f.get("missing_ranges")))
        prev = out.get(key, ())
        out[key] = None if ranges is None or prev is None else (*prev, *ranges)
    return out, run["run_id"]


def read_cluster(
    session: MetadataStore, root: str, racks_znode: str, strict_racks: bool
) -> tuple[BookieRegistry, dict[str, str]]:
    """The bookie registrations and Pulsar's rack map."""
    registry = list_bookies(session, root)
    if strict_racks:
        doc = read_racks_strict(session, racks_znode)
        racks = dict(doc.racks) if doc is not None else {}
    else:
        racks = read_racks(session, racks_znode)
    return registry, racks


def load_state(
    session: MetadataStore,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    warehouse: str | None = None,
    racks_znode: str = DEFAULT_RACKS_ZNODE,
    strict_racks: bool = False,
) -> ClusterState:
    """Read the metadata, registrations, racks (over the command's ``session``) and (with
    ``warehouse``) the latest findings."""
    t0 = time.monotonic()
    plan = ScanPlan.read(session, root)
    # Every view lives until the answer: the collector's full passes would rescan them over
    # and over as the list grows (jobs/runtime/gc_pause.py); one pass after the scan instead.
    with paused_gc():
        views = list(scan_dirs(session, plan.dirs))
    account = plan.account(session, scanned_per_directory(v.znode_path for v in views), root)
    registry, racks = read_cluster(session, root, racks_znode, strict_racks)
    named = named_bookies(views)
    registered = set(registry.all())
    state = ClusterState(
        views,
        frozenset(registry.writable),
        frozenset(registry.readonly),
        frozenset(named - registered),
        racks,
        unaccounted=account.unaccounted,
    )
    if warehouse is not None:
        found, state.audit_run_id = findings_missing(warehouse)
        state.missing = current_missing(found, views)
    log.info(
        "whatif: %d ledgers; bookies: %d %s, %d %s, %d %s; %d missing replicas from %s; %.1fs",
        len(views),
        len(state.writable),
        BookieState.WRITABLE,
        len(state.readonly),
        BookieState.READONLY,
        len(state.lost),
        BookieState.LOST,
        len(state.missing),
        audit_used(state.audit_run_id),
        time.monotonic() - t0,
    )
    return state


# ---- whatif ----------------------------------------------------------------------------------


def add_whatif_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``bkaudit whatif`` flags."""
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[/chroot]")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--bookie", default=None, help="bookie id(s) to fail, comma-separated")
    target.add_argument("--rack", default=None, help="fail every bookie of this rack")
    parser.add_argument(
        "--warehouse", default=None, help="count the latest audit's missing replicas as gone"
    )
    parser.add_argument(
        "--exit-code", action="store_true", help="exit 1 when the verdict is UNSAFE"
    )
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    parser.add_argument("--racks-znode", default=DEFAULT_RACKS_ZNODE, help="Pulsar's rack document")
    parser.add_argument(
        "--min-racks",
        type=int,
        default=DEFAULT_MIN_RACKS,
        help="racks a writer's write quorum needs (BookKeeper's minNumRacksPerWriteQuorum)",
    )
    parser.add_argument(
        "--max-ledgers", type=int, default=50, help="ledgers listed per section (counts are full)"
    )
    from jobs.options.zookeeper import add_connection_arguments, add_session_timeout_argument

    add_session_timeout_argument(
        parser, default=30.0, effect="a pause longer than this fails the run (exit 3)"
    )

    return add_connection_arguments(parser)


@dataclass
class WhatIfResult:
    """A whatif answer: the impacts of the ledgers harmed, and the verdict."""

    failed: frozenset[str]
    impacts: list[LedgerImpact]
    verdict: str
    notes: list[str]


def what_if(
    state: ClusterState, failed: Iterable[str], min_racks: int = DEFAULT_MIN_RACKS
) -> WhatIfResult:
    """The impact of ``failed`` failing next, on every ledger."""
    failed = frozenset(failed)
    gone = state.lost - failed
    writer = WriterCheck(state.writable - failed, state.racks, min_racks)
    impacts = []
    for v in state.views:
        imp = ledger_impact(
            v, failed, gone=gone, missing=state.missing, writer=writer, max_ranges=20
        )
        if imp is not None and imp.harmed:
            impacts.append(imp)
    # Fail closed: a ledger we could not read may be one the failure harms.
    notes = [f"UNSAFE: {gap}; not provably safe" for gap in state.coverage.notes()]
    verdict = Verdict.UNSAFE if impacts or notes else Verdict.SAFE
    return WhatIfResult(failed, impacts, verdict, notes)


def _fmt_ranges(imp: LedgerImpact) -> str:
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in imp.lost_ranges)
    return text + (" ..." if imp.lost_ranges_truncated else "")


def audit_used(audit_run_id: str | None) -> str:
    """The audit run whose missing replicas an answer counts, as whatif and blastradius say
    it: ``audit <run id>``, or ``no audit`` (never "audit None")."""
    return f"audit {audit_run_id}" if audit_run_id else "no audit"


def format_whatif(res: WhatIfResult, state: ClusterState, max_ledgers: int = 50) -> str:
    """The report text."""
    lines = [*res.notes]
    lines.append(
        f"whatif: {len(res.failed)} bookie{'s' * (len(res.failed) != 1)} failing: "
        + ", ".join(sorted(res.failed))
    )
    if state.lost:
        lines.append(f"already {BookieState.LOST}: " + ", ".join(sorted(state.lost)))
    audit = audit_used(state.audit_run_id)
    if state.audit_run_id:
        lines.append(f"missing replicas from {audit}: {len(state.missing)} fragments")
    else:  # say so: the answer counts only what the metadata and registrations show
        lines.append(
            f"{audit}: replicas an audit found missing are not counted "
            "(--warehouse counts the latest audit's)"
        )
    below = [i for i in res.impacts if i.below_aq]
    lost = [i for i in res.impacts if i.lost]
    blocked = [i for i in res.impacts if i.writer_blocked is not None]
    unknown = sum(1 for i in below if i.entries_unknown)
    lines.append(
        f"ledgers that would fall below AQ: {len(below)} "
        f"({sum(i.below_aq_entries for i in below)} entries"
        + (f"; {unknown} open ledgers whose last segment's entries are unknown" if unknown else "")
        + ")"
    )
    for i in below[:max_ledgers]:
        lines.append(
            f"  ledger {i.ledger_id}  {i.state}  {i.below_aq_entries} entries below AQ"
            + (" (+ open segment)" if i.entries_unknown else "")
            + (f"  topic {i.topic}" if i.topic else "")
        )
    lines.append(
        f"ledgers that would have no replica (data lost): {len(lost)} "
        f"({sum(i.lost_entries for i in lost)} entries)"
    )
    for i in lost[:max_ledgers]:
        lines.append(
            f"  ledger {i.ledger_id}  {i.lost_entries} entries lost"
            + (f" [{_fmt_ranges(i)}]" if i.lost_ranges else "")
            + (f"  topic {i.topic}" if i.topic else "")
        )
    lines.append(f"open ledgers whose writer could not replace the bookies: {len(blocked)}")
    for i in blocked[:max_ledgers]:
        lines.append(
            f"  ledger {i.ledger_id}  {i.writer_blocked}"
            + (f"  topic {i.topic}" if i.topic else "")
        )
    topics: dict[str, list[LedgerImpact]] = defaultdict(list)
    for i in res.impacts:
        topics[i.topic or "(no topic)"].append(i)
    lines.append(f"topics affected: {len([t for t in topics if t != '(no topic)'])}")
    for t in sorted(topics, key=lambda t: (-len(topics[t]), t))[:max_ledgers]:
        imps = topics[t]
        lines.append(
            f"  {t}: {sum(i.below_aq for i in imps)} ledgers below AQ, "
            f"{sum(i.lost for i in imps)} lost ({sum(i.lost_entries for i in imps)} entries), "
            f"{sum(i.writer_blocked is not None for i in imps)} writers blocked"
        )
    lines.append(f"verdict: {res.verdict}")
    return "\n".join(lines)


def resolve_targets(state: ClusterState, bookie: str | None, rack: str | None) -> tuple[
    frozenset[str], list[str]
]:  # fmt: skip
    """The bookies to fail and notes for the output; raises UsageError for unknown names."""
    known = set(state.bookies)
    notes: list[str] = []
    if bookie is not None:
        wanted = [b.strip() for b in bookie.split(",") if b.strip()]
        unknown = [b for b in wanted if b not in known]
        if not wanted or unknown:
            raise UsageError(f"unknown bookie {', '.join(unknown) or repr(bookie)}")
        return frozenset(wanted), notes
    assert rack is not None
    by_rack: dict[str, set[str]] = defaultdict(set)
    for b in known:
        by_rack[rack_of(b, state.racks)].add(b)
    # Pulsar normalizes racks with a leading "/" (BookieRackAffinityMapping).
    name = rack if rack in by_rack or rack == UNKNOWN_RACK else "/" + rack.lstrip("/")
    if name not in by_rack:
        raise UsageError(f"unknown rack {rack} (racks: {', '.join(sorted(by_rack)) or 'none'})")
    norack = sorted(by_rack.get(UNKNOWN_RACK, ()))
    if norack:
        notes.append(
            f'bookies with no rack count as one rack "{UNKNOWN_RACK}": ' + ", ".join(norack)
        )
    notes.append(f"rack {name}: " + ", ".join(sorted(by_rack[name])))
    return frozenset(by_rack[name]), notes


def run_whatif(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point for parsed arguments (``bkaudit whatif``)."""
    session = open_command_store("whatif", args, session_timeout=args.zk_session_timeout)
    if session is None:
        return ExitStatus.OPERATOR_ERROR
    try:
        with session, SessionGuard(session) as guard:
            state = load_state(
                session,
                root=args.ledgers_root,
                warehouse=args.warehouse,
                racks_znode=args.racks_znode,
                strict_racks=args.rack is not None,
            )
            guard.check("the metadata scan")  # what it read is one view, or no answer
        failed, notes = resolve_targets(state, args.bookie, args.rack)
        res = what_if(state, failed, args.min_racks)
        res.notes = [*notes, *res.notes]
        print(format_whatif(res, state, args.max_ledgers), file=out or sys.stdout)
    except (UsageError, RacksFormatError) as exc:
        print(f"whatif: {exc}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    except Exception as exc:  # no cluster, unreadable tables, an expired session: one line
        log.debug("whatif failed", exc_info=True)
        print(f"whatif: {one_line(exc)}", file=sys.stderr)
        return for_error(exc)
    # Unread ledgers make the verdict UNSAFE (fail closed) and the run incomplete: never 0.
    missed = ExitStatus.OK if state.coverage.complete else ExitStatus.INCOMPLETE
    if args.exit_code and res.verdict == Verdict.UNSAFE:
        return worst(ExitStatus.FINDINGS, missed)
    return missed
