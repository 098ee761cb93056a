"""Extract: ledger metadata, bookie registrations and bookie entry lists into DataFrames.

Everything that talks to ZooKeeper or to bookies lives here. The heavy parts run on the
executors: the metadata scan (each task lists its own ledger-id ranges and reads them over
its own ZooKeeper session with a bounded number of reads in flight) and the entry-list fetch
(each task has its own bookie client and a bounded window of requests). The driver only
plans the ranges and reads the bookie registrations.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import logging
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from bklib.availability import decode as decode_availability
from bklib.availability import from_entry_ids
from bklib.errors import (
    BKError,
    BKTimeoutError,
    BookieHandleNotAvailableError,
    DigestMatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from bklib.meta import paths
from bklib.meta.model import LedgerMetadata, LedgerState
from bklib.meta.paths import LayoutKind
from bklib.meta.registration import list_bookies
from bklib.meta.scan import DEFAULT_MAX_IN_FLIGHT, scan_ledgers
from bklib.meta.store import LedgerStore, connect
from bklib.quorum import iter_stripe
from jobs.transform import (
    BOOKIE_ENTRIES_SCHEMA,
    BOOKIE_SCHEMA,
    CHECK_DEEP,
    LEDGER_SCHEMA,
    LOST,
    READONLY,
    STATUS_NO_LEDGER,
    STATUS_OK,
    STATUS_UNREACHABLE,
    WRITABLE,
    healthy_ledgers,
)

log = logging.getLogger(__name__)

DEFAULT_LEDGERS_PER_TASK = 50_000
"""Target ledgers per metadata-scan task: big enough to amortise a ZooKeeper session."""

_BOOKIE_ENTRIES_ARROW = to_arrow_schema(BOOKIE_ENTRIES_SCHEMA)
_OUT_BATCH = 2_000


# ---- metadata scan --------------------------------------------------------------------------


@dataclass(frozen=True)
class ScanDir:
    """A directory whose children are ledger znodes: one contiguous ledger-id range.

    ``prefix`` is the id digits the path contributes; a leaf ``L1234`` adds the rest.
    """

    path: str
    prefix: str
    count: int


def _leaf_dirs(store: LedgerStore) -> list[ScanDir]:
    """Every directory holding ledger leaves, with its child count (from the znode stat)."""
    zk, root = store.zk, store.root

    def children(path: str) -> list[str]:
        try:
            return sorted(zk.get_children(path))
        except Exception:  # vanished meanwhile: nothing under it
            return []

    def count(path: str) -> int:
        stat = zk.exists(path)
        return int(stat.numChildren) if stat is not None else 0

    out: list[ScanDir] = []
    top = children(root)
    flat = [c for c in top if paths.FLAT_LEAF_RE.match(c)]
    if flat:
        out.append(ScanDir(root, "", len(flat)))
    for l1 in (c for c in top if paths.SHORT_TOP_RE.match(c)):
        for l2 in children(paths.join(root, l1)):
            if paths.LEVEL_RE.match(l2):
                p = paths.join(root, l1, l2)
                out.append(ScanDir(p, l1 + l2, count(p)))

    def walk_long(path: str, prefix: str, depth: int) -> None:
        for child in children(path):
            if not paths.LEVEL_RE.match(child):
                continue
            p = paths.join(path, child)
            if depth == 3:
                out.append(ScanDir(p, prefix + child, count(p)))
            else:
                walk_long(p, prefix + child, depth + 1)

    for l1 in (c for c in top if paths.LONG_TOP_RE.match(c)):
        walk_long(paths.join(root, l1), l1, 1)
    return out


def plan_scan(dirs: list[ScanDir], tasks: int) -> list[list[ScanDir]]:
    """Spread the directories over at most ``tasks`` groups of similar ledger counts
    (largest first, each to the lightest group)."""
    tasks = max(1, min(tasks, len(dirs)))
    heap: list[tuple[int, int]] = [(0, k) for k in range(tasks)]
    groups: list[list[ScanDir]] = [[] for _ in range(tasks)]
    for d in sorted(dirs, key=lambda d: -d.count):
        load, k = heapq.heappop(heap)
        groups[k].append(d)
        heapq.heappush(heap, (load + d.count, k))
    for g in groups:
        g.sort(key=lambda d: d.path)
    return [g for g in groups if g]


def _segments(md: LedgerMetadata) -> list[dict[str, Any]]:
    out = []
    for i, s in enumerate(md.segments):
        if i + 1 < len(md.segments):
            last: int | None = md.segments[i + 1].first_entry_id - 1
            if md.is_closed and last is not None:
                # Nothing past lastEntryId belongs to a closed ledger (spec §6.1 rule 15).
                last = min(last, md.last_entry_id)
        elif md.is_closed:
            last = md.last_entry_id
        else:
            last = None  # ends at the LAC, which only the bookies know
        out.append(
            {
                "first_entry_id": s.first_entry_id,
                "last_entry_id": last,
                "ensemble": list(s.ensemble),
            }
        )
    return out


def ledger_row(
    ledger_id: int, path: str, md: LedgerMetadata | None, version: int, error: str | None
) -> tuple[Any, ...]:
    """A LEDGER_SCHEMA row from a scan result."""
    if md is None:
        return (
            ledger_id,
            path,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            error,
        )
    return (
        ledger_id,
        path,
        version,
        md.state.name,
        md.ensemble_size,
        md.write_quorum,
        md.ack_quorum,
        md.last_entry_id,
        md.length,
        md.digest_type.name if md.digest_type is not None else None,
        md.password,
        md.ctime,
        _segments(md),
        None,
    )


def _scan_task(
    hosts: str, root: str, kind: LayoutKind, auth: str | None, max_in_flight: int
) -> Callable[[Iterable[list[ScanDir]]], Iterator[tuple[Any, ...]]]:
    def run(groups: Iterable[list[ScanDir]]) -> Iterator[tuple[Any, ...]]:
        dirs = [d for g in groups for d in g]
        if not dirs:
            return
        zk = connect(hosts, auth=auth)
        try:

            def ids() -> Iterator[int]:
                for d in dirs:
                    try:
                        names = sorted(zk.get_children(d.path))
                    except Exception as exc:  # a deleted directory holds no ledgers
                        log.info("scan: cannot list %s: %s", d.path, exc)
                        continue
                    for name in names:
                        leaf = paths.FLAT_LEAF_RE if d.prefix == "" else paths.LEAF_RE
                        if leaf.match(name):
                            yield int(d.prefix + name[1:])

            for r in scan_ledgers(
                hosts, ids(), root=root, kind=kind, max_in_flight=max_in_flight, auth=auth
            ):
                yield ledger_row(
                    r.ledger_id, r.path, r.metadata, r.version, None if r.ok else str(r.error)
                )
        finally:
            zk.stop()
            zk.close()

    return run


def scan_ledgers_df(
    spark: SparkSession,
    hosts: str,
    *,
    root: str = "/ledgers",
    auth: str | None = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ledgers_per_task: int = DEFAULT_LEDGERS_PER_TASK,
) -> tuple[DataFrame, LayoutKind]:
    """Every ledger's metadata (LEDGER_SCHEMA), read on the executors, and the layout kind.

    The driver lists only the directories of the ledger tree (one per 10,000 ids in the
    hierarchical layout); each task lists and reads its own directories. A corrupt or
    unreadable znode becomes a row with ``error`` naming it; a ledger deleted meanwhile is
    skipped. The DataFrame is lazy: persist it before using it twice.
    """
    zk = connect(hosts, auth=auth)
    try:
        store = LedgerStore(zk, root)
        kind = store.kind
        dirs = _leaf_dirs(store)
    finally:
        zk.stop()
        zk.close()
    total = sum(d.count for d in dirs)
    tasks = max(spark.sparkContext.defaultParallelism, -(-total // max(1, ledgers_per_task)))
    groups = plan_scan(dirs, tasks)
    log.info(
        "metadata scan: about %d ledgers in %d directories, %d tasks, %s layout",
        total,
        len(dirs),
        len(groups),
        kind.value,
    )
    rdd = spark.sparkContext.parallelize(groups, max(1, len(groups))).mapPartitions(
        _scan_task(hosts, root, kind, auth, max_in_flight)
    )
    return spark.createDataFrame(rdd, LEDGER_SCHEMA), kind


def reread_ledgers(
    spark: SparkSession,
    ledger_ids: DataFrame,
    hosts: str,
    *,
    root: str = "/ledgers",
    kind: LayoutKind = LayoutKind.HIERARCHICAL,
    auth: str | None = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
) -> DataFrame:
    """Re-read the given ledgers' metadata now: (ledger_id, first_entry_id, bookie_id,
    error), one row per segment and bookie, or one error row. Deleted ledgers yield nothing."""

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        ids = sorted(r.ledger_id for r in rows)
        if not ids:
            return
        for r in scan_ledgers(
            hosts, ids, root=root, kind=kind, max_in_flight=max_in_flight, auth=auth
        ):
            if r.metadata is None:
                yield (r.ledger_id, None, None, str(r.error))
                continue
            for s in r.metadata.segments:
                for b in s.ensemble:
                    yield (r.ledger_id, s.first_entry_id, b, None)

    schema = "ledger_id long, first_entry_id long, bookie_id string, error string"
    parts = max(1, spark.sparkContext.defaultParallelism)
    rdd = ledger_ids.select("ledger_id").repartition(parts).rdd.mapPartitions(run)
    return spark.createDataFrame(rdd, schema)


# ---- bookies -------------------------------------------------------------------------------


def _host_port(bookie_id: str) -> tuple[str | None, int | None]:
    host, sep, port = bookie_id.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return None, None


def bookies_df(
    spark: SparkSession,
    hosts: str,
    ledgers: DataFrame,
    *,
    root: str = "/ledgers",
    auth: str | None = None,
) -> DataFrame:
    """Registered bookies (writable / readonly) and lost ones: named in some ensemble of a
    readable ledger but not registered (BOOKIE_SCHEMA)."""
    zk = connect(hosts, auth=auth)
    try:
        registry = list_bookies(zk, root)
    finally:
        zk.stop()
        zk.close()
    named = {
        r.bookie_id
        for r in healthy_ledgers(ledgers)
        .select(F.explode("segments").alias("s"))
        .select(F.explode("s.ensemble").alias("bookie_id"))
        .distinct()
        .collect()
    }
    rows = []
    for bid, reg in sorted(registry.all().items()):
        host, port = _host_port(bid)
        if reg.info is not None:
            with contextlib.suppress(BKError):
                host, port = reg.info.rpc_address()
        rows.append((bid, READONLY if reg.readonly else WRITABLE, host, port, reg.error))
    for bid in sorted(named - set(registry.all())):
        host, port = _host_port(bid)
        rows.append((bid, LOST, host, port, "named in an ensemble but not registered"))
    return spark.createDataFrame(rows, BOOKIE_SCHEMA)


# ---- bookie entry lists ---------------------------------------------------------------------


@dataclass(frozen=True)
class FetchSettings:
    """Timeouts and windows of the entry-list fetch (picklable: shipped to executors)."""

    read_timeout: float = 5.0
    connect_timeout: float = 5.0
    ledgers_in_flight: int = 64
    """Ledgers with list-entries / read-LAC requests outstanding per task."""
    reads_in_flight: int = 256
    """Entry reads outstanding per task when probing or verifying digests."""

    @property
    def guard(self) -> float:
        """How long to wait on a future: the request times itself out well before."""
        return self.read_timeout + 3 * self.connect_timeout + 5.0


SILENT_STRIKES = 3
"""Ledgers in a row on which a bookie answered nothing before a task stops asking it."""

# Errors meaning "cannot talk to this bookie at all": later requests would fail the same way.
_DOWN_ERRORS = (BookieHandleNotAvailableError, ConnectionError, OSError)


class _RunBuilder:
    """Accumulates ids, asked in ascending stripe order, into runs per outcome.

    Consecutive stripe entries with the same outcome share one run, which then also spans
    the ids between them that are not on the stripe (never asked; the transform ignores
    them), so a healthy bookie's stripe stays one run instead of one per entry.
    """

    def __init__(self) -> None:
        self.runs: dict[str, list[list[int]]] = {"held": [], "unknown": []}
        self._last_kind: str | None = None

    def add(self, entry_id: int, kind: str) -> None:
        runs = self.runs.get(kind)
        if runs is not None:
            if self._last_kind == kind and runs:
                runs[-1][1] = entry_id
            else:
                runs.append([entry_id, entry_id])
        self._last_kind = kind

    def cut(self) -> None:
        """Start fresh runs (a new segment)."""
        self._last_kind = None

    def as_rows(self, kind: str) -> list[dict[str, int]]:
        return [{"first_entry_id": a, "last_entry_id": b} for a, b in self.runs[kind]]


def _runs_rows(runs: Iterable[tuple[int, int]]) -> list[dict[str, int]]:
    return [{"first_entry_id": a, "last_entry_id": b} for a, b in runs]


def _digest(ledger: dict[str, Any]) -> Any:
    from bklib.digest import digest_manager
    from bklib.meta.model import DigestType

    if ledger["digest_type"] is None:
        return None
    try:
        return digest_manager(
            ledger["ledger_id"], DigestType[ledger["digest_type"]], ledger["password"] or b""
        )
    except BKError:
        return None


def _lac_of(result: Any, dm: Any) -> int | None:
    """A READ_LAC answer's LAC: max of the explicit LAC and the last entry's piggybacked one.
    A body failing its digest tells nothing (spec §1.3: count it as unknown)."""
    from bklib.digest import parse_entry_header

    values = []
    if result.lac_body is not None:
        with contextlib.suppress(BKError, struct.error):
            values.append(
                dm.verify_lac(result.lac_body)
                if dm
                else struct.unpack_from(">q", result.lac_body, 8)[0]
            )
    if result.last_entry_body is not None:
        with contextlib.suppress(BKError, struct.error):
            if dm:
                values.append(dm.verify_entry(result.last_entry_body, None).lac)
            else:
                values.append(parse_entry_header(result.last_entry_body)[2])
    return max(values) if values else None


def _stripe_plan(
    ledger: dict[str, Any], bookie: str, lac: int | None
) -> list[tuple[int, int, int]]:
    """(index, first, last) of every segment range where ``bookie`` must hold entries."""
    segs = ledger["segments"] or []
    out = []
    for s in segs:
        last = s["last_entry_id"] if s["last_entry_id"] is not None else lac
        if last is None or last < s["first_entry_id"]:
            continue
        for i, b in enumerate(s["ensemble"]):
            if b == bookie:
                out.append((i, s["first_entry_id"], last))
    return out


class _Fetcher:
    """One task's fetch state: the bookie client and what it learnt about each bookie."""

    def __init__(self, client: Any, settings: FetchSettings, deep: bool) -> None:
        self.client = client
        self.settings = settings
        self.deep = deep
        self.no_list: set[str] = set()  # list-entries timed out but reads work: probe
        self.down: dict[str, str] = {}  # silent too often: skip for the rest of the task
        self.strikes: dict[str, int] = {}  # ledgers in a row with no answer at all

    def silent(self, bookie: str, error: str) -> None:
        """Count a ledger on which ``bookie`` answered nothing; after a few in a row it is
        treated as down for the rest of the task, so a black-holed bookie does not cost a
        timeout per ledger. One ledger's fault alone never marks it down."""
        n = self.strikes.get(bookie, 0) + 1
        self.strikes[bookie] = n
        if n >= SILENT_STRIKES:
            self.down[bookie] = f"unreachable: {error}"
            log.warning("bookie %s: no answer on %d ledgers in a row; treated as down", bookie, n)

    def answered(self, bookie: str) -> None:
        self.strikes.pop(bookie, None)

    def submit(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future[Any]:
        return self.client.submit(fn)

    def wait(self, fut: concurrent.futures.Future[Any]) -> Any:
        try:
            return fut.result(self.settings.guard)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise BKTimeoutError(f"no answer within {self.settings.guard}s") from None

    def read_entries(
        self, ledger: dict[str, Any], bookie: str, lac: int | None, dm: Any
    ) -> dict[str, Any]:
        """Read every entry ``bookie`` must hold (pipelined), verifying digests in deep mode."""
        lid = ledger["ledger_id"]
        t = self.settings.read_timeout
        runs = _RunBuilder()
        bad: list[int] = []
        errors: list[str] = []
        held = unknown = missing = 0
        window: list[tuple[int, concurrent.futures.Future[Any]]] = []

        def drain() -> None:
            nonlocal held, unknown, missing
            for x, fut in window:
                try:
                    res = self.wait(fut)
                except (NoSuchEntryError, NoSuchLedgerError):
                    runs.add(x, "missing")
                    missing += 1
                    continue
                except BKError as exc:
                    runs.add(x, "unknown")
                    unknown += 1
                    if len(errors) < 3:
                        errors.append(str(exc))
                    continue
                runs.add(x, "held")
                held += 1
                if self.deep and dm is not None:
                    try:
                        dm.verify_entry(res.body, x)
                    except DigestMatchError:
                        bad.append(x)
            window.clear()

        for idx, first, last in _stripe_plan(ledger, bookie, lac):
            drain()
            runs.cut()
            e, wq = ledger["ensemble_size"], ledger["write_quorum"]
            for x in iter_stripe(idx, first, last, e, wq):
                window.append((x, self.submit(lambda p, x=x: p.read(bookie, lid, x, timeout=t))))
                if len(window) >= self.settings.reads_in_flight:
                    drain()
        drain()
        # Not one answer: the bookie is unreachable, not empty.
        status = STATUS_UNREACHABLE if unknown and not held and not missing else STATUS_OK
        return {
            "status": status,
            "entries": runs.as_rows("held"),
            "bad_entries": _runs_rows(from_entry_ids(bad).runs()),
            "unknown_entries": runs.as_rows("unknown"),
            "error": "; ".join(errors) or None,
            "_answered": held + missing,
            "_unknown": unknown,
        }


def _fetch_task(
    hosts: str,
    root: str,
    lost: frozenset[str],
    check: str,
    settings: FetchSettings,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    deep = check == CHECK_DEEP

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from bklib.client.connection import ClientConfig
        from bklib.client.pool import SyncBookieClient

        config = ClientConfig(
            read_timeout=settings.read_timeout,
            connect_timeout=settings.connect_timeout,
            reconnect_backoff_initial=0.05,
            reconnect_backoff_max=1.0,
        )
        out: list[dict[str, Any]] = []
        with SyncBookieClient(hosts, ledgers_root=root, config=config) as client:
            fetcher = _Fetcher(client, settings, deep)
            pending: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = []
            t = settings.read_timeout

            def finish(item: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
                ledger, lac_futs, list_futs = item
                out.extend(_finish_ledger(fetcher, ledger, lac_futs, list_futs))

            for batch in batches:
                for ledger in batch.to_pylist():
                    lid = ledger["ledger_id"]
                    segs = ledger["segments"] or []
                    bookies = list(
                        dict.fromkeys(b for s in segs for b in s["ensemble"] if b not in lost)
                    )
                    lac_futs: dict[str, Any] = {}
                    if ledger["state"] != LedgerState.CLOSED.name and segs:
                        for b in dict.fromkeys(segs[-1]["ensemble"]):
                            if b not in lost and b not in fetcher.down:
                                lac_futs[b] = client.submit(
                                    lambda p, b=b, lid=lid: p.read_lac(b, lid, timeout=t)
                                )
                    list_futs: dict[str, Any] = {}
                    for b in bookies:
                        if deep or b in fetcher.no_list or b in fetcher.down:
                            list_futs[b] = None
                        else:
                            list_futs[b] = client.submit(
                                lambda p, b=b, lid=lid: p.list_entries(b, lid, timeout=t)
                            )
                    pending.append((ledger, lac_futs, list_futs))
                    if len(pending) >= settings.ledgers_in_flight:
                        finish(pending.pop(0))
                    if len(out) >= _OUT_BATCH:
                        yield pa.RecordBatch.from_pylist(out, schema=_BOOKIE_ENTRIES_ARROW)
                        out.clear()
            while pending:
                finish(pending.pop(0))
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=_BOOKIE_ENTRIES_ARROW)

    return run


def _finish_ledger(
    fetcher: _Fetcher,
    ledger: dict[str, Any],
    lac_futs: dict[str, Any],
    list_futs: dict[str, Any],
) -> list[dict[str, Any]]:
    lid = ledger["ledger_id"]
    dm = _digest(ledger)
    lacs: dict[str, int | None] = {}
    for b, fut in lac_futs.items():
        try:
            lacs[b] = _lac_of(fetcher.wait(fut), dm)
        except BKError:
            lacs[b] = None  # NoSuchEntry/NoSuchLedger or unknown: no LAC from this bookie
    known = [v for v in lacs.values() if v is not None]
    lac = max(known) if known else None
    rows = []
    for b, fut in list_futs.items():
        row: dict[str, Any] = {
            "ledger_id": lid,
            "bookie_id": b,
            "status": STATUS_OK,
            "method": "LIST",
            "entries": [],
            "bad_entries": [],
            "unknown_entries": [],
            "lac": lacs.get(b),
            "error": None,
        }
        if b in fetcher.down:
            if fut is not None:
                fut.cancel()
            row.update(status=STATUS_UNREACHABLE, error=fetcher.down[b])
            rows.append(row)
            continue
        probe = fut is None
        if fut is not None:
            try:
                runs = decode_availability(fetcher.wait(fut))
                row["entries"] = _runs_rows(runs.runs())
                fetcher.answered(b)
            except (NoSuchLedgerError, NoSuchEntryError) as exc:
                # Only a negative answer means "does not have it" (spec §6.1 rule 1).
                row.update(status=STATUS_NO_LEDGER, error=str(exc))
            except BKTimeoutError as exc:
                # Java bookies on DbLedgerStorage never answer list-entries: probe by reads.
                log.info("bookie %s: list-entries timed out (%s); probing by reads", b, exc)
                probe = True
            except _DOWN_ERRORS as exc:
                log.warning("bookie %s unreachable for ledger %d: %s", b, lid, exc)
                fetcher.silent(b, str(exc))
                row.update(status=STATUS_UNREACHABLE, error=f"unreachable: {exc}")
            except (BKError, ValueError) as exc:
                row.update(status=STATUS_UNREACHABLE, error=f"list-entries failed: {exc}")
        if probe:
            got = fetcher.read_entries(ledger, b, lac, dm)
            row.update(
                method="READ" if fetcher.deep else "PROBE",
                status=got["status"],
                entries=got["entries"],
                bad_entries=got["bad_entries"],
                unknown_entries=got["unknown_entries"],
                error=got["error"],
            )
            if got["_unknown"] and not got["_answered"]:
                fetcher.silent(b, got["error"] or "no answer")
            elif got["_answered"]:
                fetcher.answered(b)
                if fut is not None:
                    fetcher.no_list.add(b)  # answers reads but not list-entries
        rows.append(row)
    return rows


def fetch_bookie_entries(
    ledgers: DataFrame,
    bookies: DataFrame,
    hosts: str,
    check: str,
    *,
    root: str = "/ledgers",
    settings: FetchSettings | None = None,
    lost: frozenset[str] | None = None,
) -> DataFrame:
    """What every non-lost bookie of every readable ledger holds (BOOKIE_ENTRIES_SCHEMA).

    ``replicas``: one list-entries RPC per (ledger, bookie); a bookie whose list request
    times out (Java DbLedgerStorage) is probed with pipelined reads of its stripe instead.
    ``deep``: every expected entry is read and its digest verified. Ledgers that are not
    closed also get their LAC read from the last ensemble. Lazy: persist before reuse.
    """
    from jobs.transform import lost_bookie_ids

    settings = settings or FetchSettings()
    lost = lost if lost is not None else lost_bookie_ids(bookies)
    cols = [
        "ledger_id",
        "state",
        "ensemble_size",
        "write_quorum",
        "ack_quorum",
        "digest_type",
        "password",
        "segments",
    ]
    return (
        healthy_ledgers(ledgers)
        .select(*cols)
        .mapInArrow(_fetch_task(hosts, root, lost, check, settings), BOOKIE_ENTRIES_SCHEMA)
    )
