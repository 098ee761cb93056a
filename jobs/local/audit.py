"""The audit in this process: the engine's steps over the whole cluster, no JVM, the tables
written through delta-rs. Same steps and same rows as :mod:`jobs.spark.audit_job`."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from bklib.audit.capabilities import ProbeCandidates
from bklib.audit.checks import check as check_kind
from bklib.audit.classify import keep_still_current, summarize
from bklib.audit.completeness import run_status
from bklib.audit.engine import (
    ScanPlan,
    bookie_rows,
    capability_counts,
    check_client,
    check_ledgers,
    learn_bookies,
    learns_capabilities,
    lost_bookies,
    read_ledgers,
    scan_dirs,
)
from bklib.audit.model import Finding, LedgerView, named_bookies
from bklib.audit.pipeline import run_audit_steps
from bklib.meta.registration import list_bookies
from bklib.meta.store import LeafDir
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.zookeeper.budget import shared_budget
from bklib.states import BookieState, CountKey, Executor
from jobs.local.ledger_columns import LedgerColumns, views_naming
from jobs.local.scan_shard import (
    SPLIT_MIN_LEDGERS,
    SPLIT_MIN_PROBED_LEDGERS,
    ScanShard,
    ShardCheck,
    ShardJob,
    ShardReads,
    split_bounds,
    split_dirs,
)
from jobs.local.scan_summary import ShardScan
from jobs.runs.audit_run import log_metadata, record_interrupted
from jobs.runs.placement import (
    PlacementPass,
    final_placement_counts,
    placement_counts,
    under_replication,
)
from jobs.runtime import interrupts
from jobs.runtime.cores import usable_cores
from jobs.runtime.gc_pause import paused_gc
from jobs.runtime.logs import logging_settings
from jobs.runtime.progress import track
from jobs.tables import delta
from jobs.tables.ledgers_arrow import ledgers_table
from jobs.tables.runs import RunRecord, new_run_id
from jobs.tables.schema import AUDIT_RUNS, BOOKIES, FRAGMENTS, LEDGERS, RUN_DATE, run_day

if TYPE_CHECKING:
    from jobs.runs.audit_run import AuditConfig

__all__ = ["LocalAudit"]

log = logging.getLogger("jobs.commands.audit")

PROGRESS_EVERY = 5.0

T = TypeVar("T")


class LocalAudit:
    """One audit run in-process. ``plan`` is the scan plan the executor choice was made from;
    ``store`` the process's metadata session, which every step uses (the helper process, if
    any, opens its own)."""

    def __init__(
        self,
        config: AuditConfig,
        plan: ScanPlan,
        store: MetadataStore,
        *,
        split: bool | None = None,
    ) -> None:
        self.config = config
        self.split = split
        """Whether the run scans and checks with a helper process (:mod:`jobs.local.scan_shard`);
        None: on two cores, from :data:`~jobs.local.scan_shard.SPLIT_MIN_LEDGERS` ledgers for
        the lost check and :data:`~jobs.local.scan_shard.SPLIT_MIN_PROBED_LEDGERS` for the
        checks that read entries."""
        self.shard: ScanShard | None = None
        self.helper_probe: ProbeCandidates | None = None
        """The helper's ledgers the capability probe may ask its bookies about."""
        self.shard_ledgers: pa.Table | None = None
        """The helper's rows of the ``ledgers`` table, once it has checked its half."""
        self.own_ledgers: pa.Table | None = None
        """This process's rows of the ``ledgers`` table: built while the helper works, or
        by a columnar scan."""
        self.columnar = False
        """Whether the scan kept its ledgers as rows only (:mod:`jobs.local.ledger_columns`):
        :attr:`ledgers` stays empty and :attr:`own_ledgers` holds them."""
        self.plan = plan
        self.store = store
        started = datetime.now(timezone.utc)
        self.run = RunRecord(
            config.run_id or new_run_id(started),
            started,
            config.zk,
            config.check,
            executor=Executor.LOCAL,
        )
        self.ledgers: list[LedgerView] = []
        self.bookies: list[Any] = []
        self.findings: list[Finding] = []

    def _helper_dirs(self) -> list[LeafDir]:
        """The directories a helper process scans (none: this process scans them all)."""
        cfg = self.config
        kind = check_kind(cfg.check)
        wanted = self.split
        if wanted is None:
            least = SPLIT_MIN_PROBED_LEDGERS if kind.reads_entries else SPLIT_MIN_LEDGERS
            wanted = self.plan.expected >= least and usable_cores() >= 2
        if not wanted or cfg.rack_document is not None:
            return []
        if kind.reads_entries and cfg.fetch.reads_in_flight < 2:
            return []  # one read in flight per bookie cannot be shared by two processes
        parts = split_dirs(list(self.plan.dirs), 2)
        return parts[1] if len(parts) == 2 else []

    def _columns_only(self) -> bool:
        """Whether the scan may keep its ledgers as rows only: the check reads metadata only
        and no placement pass walks the views."""
        cfg = self.config
        return not check_kind(cfg.check).reads_entries and cfg.rack_document is None

    def scan(self) -> None:
        """Read every ledger's metadata and the bookie registrations."""
        cfg, counts = self.config, self.run.counts
        t0 = time.monotonic()
        helper_dirs = self._helper_dirs()
        own = list(self.plan.dirs)[: len(self.plan.dirs) - len(helper_dirs)]
        helper: ShardScan | None = None
        self.columnar = self._columns_only()
        with shared_budget(2 if helper_dirs else 1) as rate:
            if helper_dirs:
                self.shard = ScanShard(
                    ShardJob(cfg.zk, helper_dirs, cfg.zk_auth, cfg.scan_in_flight, rate,
                             self.run.run_id, logging_settings(),
                             probe_candidates=learns_capabilities(cfg.check),
                             columnar=self.columnar)
                )  # fmt: skip
            views = track(
                checkpointed(scan_dirs(self.store, own, max_in_flight=cfg.scan_in_flight)),
                sum(d.count for d in own),
                "metadata scan",
                logger=log,
            )
            if self.columnar:
                columns = LedgerColumns(self.run.run_id)
                scanned = columns.take(views)
                self.own_ledgers = columns.table()
            else:
                self.ledgers = list(views)
                scanned = ShardScan.of(self.ledgers)
            if self.shard is not None:
                helper = self.shard.scanned()
        registry = list_bookies(self.store, cfg.ledgers_root)
        if helper is not None:
            scanned = scanned.plus(helper)
            self.helper_probe = helper.probe
        counts[CountKey.LEDGERS] = scanned.ledgers
        counts[CountKey.METADATA_ERRORS] = scanned.metadata_errors
        counts[CountKey.LEDGERS_NOT_CLOSED] = scanned.not_closed
        self.bookies = bookie_rows(registry, scanned.named)
        counts.update(
            self.plan.account(self.store, scanned.per_directory, cfg.ledgers_root).counts()
        )
        states = Counter(b.state for b in self.bookies)
        for s in BookieState.ALL:
            counts[CountKey.bookies(s)] = states.get(s, 0)
        log_metadata(counts, time.monotonic() - t0)
        for ledger_id, error in scanned.unreadable:
            log.warning("unreadable ledger %d: %s", ledger_id, error)

    def check(self) -> None:
        """Run the configured check over every readable ledger."""
        cfg, counts = self.config, self.run.counts
        t0 = time.monotonic()
        lost = lost_bookies(self.bookies)
        pairs: Counter[tuple[str, str]] = Counter()
        found: list[Finding] = []
        if not check_kind(cfg.check).reads_entries:
            if self.shard is not None:
                self.shard.request_check(ShardCheck(lost, cfg.check))  # its half, meanwhile
            views: Iterable[LedgerView] = self.ledgers
            if self.columnar:
                assert self.own_ledgers is not None
                views = views_naming(self.own_ledgers, lost)
            for _, _, f in checkpointed(check_ledgers(views, lost, cfg.check)):
                found.extend(f)
            self._helper_checked(found, pairs)
        else:
            with check_client(
                self.store,
                ledgers_root=cfg.ledgers_root,
                settings=cfg.fetch,
                tls=cfg.tls,
            ) as client:
                self.bookies, settings = learn_bookies(
                    client, self.bookies, self._probe_picks(), cfg.fetch, cfg.check
                )
                counts.update(capability_counts(self.bookies))
                if self.shard is not None:
                    # Two processes read the same bookies: each within half the run's bounds.
                    settings = split_bounds(settings, 2)
                    reads = ShardReads(cfg.ledgers_root, settings, cfg.tls)
                    self.shard.request_check(ShardCheck(lost, cfg.check, reads))
                for _, reports, f in _progress(
                    check_ledgers(self.ledgers, lost, cfg.check, client=client, settings=settings),
                    len(self.ledgers),
                    cfg.check,
                ):
                    found.extend(f)
                    pairs.update((r.method, r.status) for r in reports)
            self._helper_checked(found, pairs)
            counts[CountKey.BOOKIE_LEDGER_PAIRS] = sum(pairs.values())
            for (method, status), n in pairs.items():
                counts[CountKey.pairs(method, status)] = n
            log.info(
                "%s: %d (ledger, bookie) answers (%s); %.1fs",
                cfg.check,
                counts[CountKey.BOOKIE_LEDGER_PAIRS],
                ", ".join(f"{m} {s}: {n}" for (m, s), n in sorted(pairs.items())) or "none",
                time.monotonic() - t0,
            )
        counts[CountKey.FRAGMENTS_BEFORE_REREAD] = len(found)
        self.findings = found

    def _probe_picks(self) -> Iterable[LedgerView] | Mapping[str, int]:
        """What the capability probe picks each bookie's ledger from: this process's views, or
        with a helper, the candidates of both halves (a bookie may be named in one only)."""
        if self.helper_probe is None:
            return self.ledgers
        both = ProbeCandidates.of(self.ledgers).plus(self.helper_probe)
        return both.targets(b.bookie_id for b in self.bookies)

    def _helper_checked(self, found: list[Finding], pairs: Counter[tuple[str, str]]) -> None:
        """Add the helper's findings and answers (after this process's: the scan's order), and
        keep its ``ledgers`` rows; nothing when the run has no helper."""
        if self.shard is None:
            return
        if self.own_ledgers is None:  # built while the helper builds its own
            self.own_ledgers = ledgers_table(self.run.run_id, self.ledgers)
        helper_found, helper_pairs, self.shard_ledgers = self.shard.checked()
        found.extend(helper_found)
        pairs.update(helper_pairs)
        self.close_helper()

    def close_helper(self) -> None:
        """Stop the helper process, if any (at once if it is still working: the run failed).
        Whoever runs the steps without :meth:`run_all` calls it when they fail."""
        if self.shard is not None:
            self.shard.close()
            self.shard = None

    def recheck(self) -> None:
        """Re-read the flagged ledgers; drop findings whose ledger changed or vanished."""
        cfg = self.config
        if not cfg.reread or not self.findings:
            return
        flagged = {f.ledger_id for f in self.findings}
        current = read_ledgers(
            self.store,
            flagged,
            root=cfg.ledgers_root,
            kind=self.plan.kind,
            max_in_flight=cfg.scan_in_flight,
        )
        before = len(self.findings)
        self.findings = keep_still_current(self.findings, current)
        self.run.counts[CountKey.DROPPED_AFTER_REREAD] = before - len(self.findings)

    def rows(
        self, first_seen: Mapping[tuple[int, int, str], datetime]
    ) -> list[tuple[str, list[dict[str, Any]]]]:
        """Settle the run's counts and status, and return its per-run tables' rows
        (fragments, ledgers, bookies); ``first_seen`` gives each finding's first detection
        (by ``(ledger_id, segment_first_entry_id, bookie_id)``), else this run's start."""
        return [(table, list(rows)) for table, rows in self.row_sources(first_seen)]

    def settle(self) -> None:
        """Settle the run's counts and status from its findings (again at each call: the
        same answer until the findings change)."""
        run = self.run
        run.counts.update(summarize(under_replication(self.findings)))
        run.counts.update(final_placement_counts(self.findings, run.counts))
        run.status = run_status(run.counts)

    def row_sources(
        self, first_seen: Mapping[tuple[int, int, str], datetime]
    ) -> list[tuple[str, Iterable[dict[str, Any]]]]:
        """:meth:`rows`, with the ledgers table's rows made as they are consumed: one row per
        ledger, so a million of them are never held as dicts at once (:meth:`load`)."""
        run = self.run
        self.settle()
        fragments = [
            {
                "run_id": run.run_id,
                "check": run.check,
                "detected_at": run.started_at,
                **f.as_row(),
                "first_detected_at": first_seen.get(f.key, run.started_at),
            }
            for f in self.findings
        ]
        ledgers = itertools.chain(
            _shard_rows(self.own_ledgers)
            if self.columnar
            else ({"run_id": run.run_id, **v.as_row()} for v in self.ledgers),
            _shard_rows(self.shard_ledgers),
        )
        bookies = [{"run_id": run.run_id, **b.as_row()} for b in self.bookies]
        return [(FRAGMENTS, fragments), (LEDGERS, ledgers), (BOOKIES, bookies)]

    def column_halves(self) -> list[pa.Table]:
        """The scanned ledgers that are rows only, not in :attr:`ledgers` (this process's
        after a columnar scan, then the helper's), in the scan's order."""
        halves = [self.own_ledgers] if self.columnar else []
        return [t for t in [*halves, self.shard_ledgers] if t is not None]

    def forget_ledgers(self) -> None:
        """Drop the scanned ledgers (views and rows) once they are written and indexed: the
        findings, bookies and counts stay for whoever acts on them."""
        self.ledgers = []
        self.own_ledgers = self.shard_ledgers = None

    def ledgers_arrow(self) -> pa.Table:
        """The run's ``ledgers`` rows as one Arrow table (this process's half, then the
        helper's): built as columns, since a million dicts would take seconds and gigabytes."""
        ledgers = self.own_ledgers
        if ledgers is None:
            ledgers = ledgers_table(self.run.run_id, self.ledgers)
        if self.shard_ledgers is not None:
            ledgers = pa.concat_tables([ledgers, self.shard_ledgers])
        return ledgers

    def load(self) -> RunRecord:
        """Append the run to the Delta tables, ``audit_runs`` last."""
        cfg, run = self.config, self.run
        t0 = time.monotonic()
        wh = cfg.warehouse
        day = run_day(run.started_at)
        # The ledgers' rows are built as columns (a million dicts would take seconds).
        tables = [t for t in self.row_sources(delta.first_detections(wh)) if t[0] != LEDGERS]
        # Three independent tables: delta-rs writes them in parallel (it releases the GIL);
        # audit_runs, which makes the run visible, only once all three are committed. A signal
        # meanwhile lets the writes finish, and the run is recorded INTERRUPTED; one during
        # the audit_runs append itself leaves the run as it is recorded (it did complete).
        with interrupts.draining(interrupts.DEFAULT_STOP_TIMEOUT):
            with concurrent.futures.ThreadPoolExecutor(3, thread_name_prefix="delta") as pool:
                writes = [
                    pool.submit(delta.append_rows, wh, table, rows, run_date=day)
                    for table, rows in tables
                ]
                ledgers = self.ledgers_arrow()
                writes.append(pool.submit(delta.append_arrow, wh, LEDGERS, ledgers, run_date=day))
                for w in writes:
                    w.result()
            signum = interrupts.received()
            if signum is not None:
                record_interrupted(
                    run, signum, lambda: delta.append_rows(wh, AUDIT_RUNS, [run.as_row()])
                )
            else:
                run.finished_at = datetime.now(timezone.utc)
                delta.append_rows(wh, AUDIT_RUNS, [run.as_row()])
                if interrupts.stop_requested():
                    interrupts.note(
                        f"run {run.run_id} recorded as {run.status} before the signal took effect"
                    )
        if signum is not None:
            interrupts.checkpoint()
        log.info(
            "load: run %s written to %s (%s); %.1fs",
            run.run_id,
            wh,
            run.status,
            time.monotonic() - t0,
        )
        return run

    def run_steps(self) -> None:
        """The audit's steps before anything is recorded (:func:`run_audit_steps`, without
        the commit): the watch records the run through its spool. A signal stops it at once
        (it only reads), even while the watch lets its repairs drain."""
        with interrupts.at_once():
            run_audit_steps(self, self.store, commit=False)

    def abandon(self) -> None:
        """:meth:`close_helper` (the pipeline's ``abandon`` step)."""
        self.close_helper()

    def commit(self) -> RunRecord:
        """:meth:`load` (the pipeline's ``commit`` step)."""
        return self.load()

    def run_all(self) -> RunRecord:
        """:meth:`run_steps` then load (after making sure every table can take the rows),
        then drop the run's ledgers, findings and bookies: the returned record holds its
        counts. A run whose session expired records nothing."""
        delta.check_writable(self.config.warehouse, (AUDIT_RUNS, LEDGERS, BOOKIES, FRAGMENTS))
        t0 = time.monotonic()
        with paused_gc():
            run = run_audit_steps(self, self.store)
            assert run is not None
            # Recorded: the run's state goes before the collector's one pass at the end of
            # paused_gc, which would otherwise walk every ledger (seconds at a million).
            self.forget_ledgers()
            self.findings, self.bookies = [], []
        # The span Java's Auditor times in "Completed checkAllLedgers in N milliSeconds"
        # (its client's start to the last mark), for comparisons without start-up.
        log.info(
            "audit %s %s: %.2fs from the metadata scan to the last commit",
            run.check,
            run.status,
            time.monotonic() - t0,
        )
        return run

    def placement(self) -> None:
        """The placement pass (metadata only, docs/placement.md) when racks are known: one
        PLACEMENT_VIOLATION finding per segment of a closed ledger that breaks the rule."""
        cfg = self.config
        if cfg.rack_document is None:
            return
        check = PlacementPass(cfg.rack_document, cfg.placement_rule)
        checked, found = 0, []
        for v in self.ledgers:
            n, f = check.ledger(v)
            checked += n
            found.extend(f)
        named = named_bookies(v for v in self.ledgers if v.is_closed)
        self.run.counts.update(
            placement_counts(checked, found, named, cfg.rack_document, cfg.placement_rule)
        )
        self.findings.extend(found)


def _shard_rows(table: pa.Table | None) -> Iterator[dict[str, Any]]:
    """``ledgers`` rows kept as Arrow (the helper's, or a columnar scan's) as dicts, made only
    when consumed: :meth:`LocalAudit.load` writes them as Arrow and never asks (at a million
    ledgers, that many dicts)."""
    if table is None:
        return
    for row in delta.arrow_rows(table):
        yield {k: value for k, value in row.items() if k != RUN_DATE}


def _progress(items: Iterator[Any], total: int, what: str) -> Iterator[Any]:
    """Pass ``items`` through: a bar with an ETA on a terminal, a line every few seconds
    otherwise (:mod:`jobs.runtime.progress`)."""
    return track(checkpointed(items), total, what, logger=log, every=PROGRESS_EVERY)


def checkpointed(items: Iterable[T]) -> Iterator[T]:
    """``items``, with :func:`~jobs.runtime.interrupts.checkpoint` before each: a run whose
    signal did not raise at once (the watch drains its work) stops at the next ledger."""
    for item in items:
        interrupts.checkpoint()
        yield item
