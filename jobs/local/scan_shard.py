"""The local audit's second core: a helper process that scans and checks half the ledgers.

One process decodes about 10,000 ledgers a second, so at a million ledgers the metadata scan
is most of a lost audit, on one core of the machine; and a check that reads entries is bound
by its one process's interpreter (docs/benchmarks.md). From :data:`SPLIT_MIN_LEDGERS` up for
the lost check, and :data:`SPLIT_MIN_PROBED_LEDGERS` for the checks that read entries, a
spawned helper scans the second half of the directories while the run's own process scans the
first. The halves are contiguous in the plan's order, so the
helper's findings and ``ledgers`` rows follow the run's own and every table comes out in the
single process's order.

The views stay in the helper: pickling a view back costs over a third of decoding it (for the
lost check it keeps none, only its rows: :mod:`jobs.local.ledger_columns`). The helper answers
in two rounds instead:

1. after its scan, :class:`ShardScan`: what the run needs of every view (the bookies they
   name, the ledgers per directory, the counts, the first unreadable znodes);
2. given the lost bookies (which need every view's bookies, hence the rounds) and, for a check
   that reads entries, the run's check settings (:class:`ShardCheck`): its findings, the
   (ledger, bookie) answers it counted, and its rows of the ``ledgers`` table as Arrow.

The helper reads its half's entries with a bookie client of its own. The run's bounds stay the
run's: the ZooKeeper budget is shared (:func:`bklib.meta.stores.zookeeper.budget.shared_budget`),
and each process reads any one bookie at half of ``--reads-in-flight`` and ``--read-rate``
(:func:`split_bounds`). Any failure of the helper (an unreachable store or bookie client, an
expired session, the process killed) fails the run: nothing it scanned counts as read.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import multiprocessing
import os
from collections import Counter
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from bklib.audit.checker import CheckSettings
from bklib.audit.engine import check_client, check_ledgers, scan_dirs
from bklib.audit.model import Finding, LedgerView
from bklib.errors import MetaStoreError
from bklib.meta.store import LeafDir
from bklib.meta.stores import MetadataStore, open_store
from bklib.meta.stores.zookeeper.budget import set_request_rate
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.tls import TlsSettings
from jobs.local.ledger_columns import LedgerColumns, views_naming
from jobs.local.scan_summary import ShardScan
from jobs.runtime import interrupts
from jobs.runtime.logs import setup_logging
from jobs.runtime.progress import MODE_ENV as PROGRESS_MODE_ENV
from jobs.runtime.progress import mode as progress_mode
from jobs.runtime.progress import track
from jobs.tables.ledgers_arrow import ledgers_table

__all__ = [
    "SPLIT_MIN_LEDGERS",
    "SPLIT_MIN_PROBED_LEDGERS",
    "ScanHelperError",
    "ScanShard",
    "ShardCheck",
    "ShardJob",
    "ShardReads",
    "split_bounds",
    "split_dirs",
]

log = logging.getLogger("jobs.commands.audit")

SPLIT_MIN_LEDGERS = 200_000
"""From this many ledgers, a lost audit with two cores splits its scan. Below it, starting the
helper (about a second) and its second round cost more than the half scan saves."""

SPLIT_MIN_PROBED_LEDGERS = 20_000
"""From this many ledgers, a check that reads entries (sample, replicas, deep) with two cores
splits its scan and its check. Each ledger's reads cost about a hundred times its decoding, so
the helper pays for itself far below the lost check's threshold (docs/benchmarks.md, "The
sample check on two cores")."""


class ScanHelperError(MetaStoreError):
    """The helper process failed or died: the run fails, and names what the helper said."""


def split_dirs(dirs: list[LeafDir], parts: int) -> list[list[LeafDir]]:
    """``dirs`` cut into at most ``parts`` contiguous runs, each cut at the directory boundary
    nearest its share of the ledgers (every run keeps at least one directory)."""
    parts = min(parts, len(dirs))
    total = sum(d.count for d in dirs)
    ends = list(itertools.accumulate(d.count for d in dirs))  # ledgers up to each directory
    bounds = [0]
    for i in range(1, parts):
        target = total * i / parts
        last = len(dirs) - (parts - i)  # later runs keep a directory each
        j = min(range(bounds[-1], last), key=lambda k: abs(ends[k] - target))
        bounds.append(j + 1)
    bounds.append(len(dirs))
    return [dirs[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def split_bounds(settings: CheckSettings, parts: int) -> CheckSettings:
    """``settings`` for one of ``parts`` processes reading the same bookies: each gets its share
    of the per-bookie bounds, so the run as a whole reads any bookie within ``--reads-in-flight``
    and ``--read-rate`` (docs/checks.md). Fewer reads in flight than ``parts`` cannot be shared:
    ValueError (such a run checks in one process)."""
    if settings.reads_in_flight < parts:
        raise ValueError(
            f"{settings.reads_in_flight} reads in flight cannot be shared by {parts} processes"
        )
    rate = settings.read_rate
    return replace(
        settings,
        reads_in_flight=settings.reads_in_flight // parts,
        read_rate=None if rate is None else rate / parts,
    )


@dataclass(frozen=True)
class ShardReads:
    """How the helper reads entries: this process's share of the check's settings
    (:func:`split_bounds`), and the run's bookie TLS (None: plaintext)."""

    ledgers_root: str
    settings: CheckSettings
    tls: TlsSettings | None = None


@dataclass(frozen=True)
class ShardCheck:
    """Round 2's request: the lost bookies, the check, and how to read entries (None: the
    lost check reads metadata only)."""

    lost: frozenset[str]
    check: str
    reads: ShardReads | None = None


@dataclass(frozen=True)
class ShardJob:
    """What the helper scans, and how."""

    locator: str
    dirs: list[LeafDir]
    auth: ZkAuth
    max_in_flight: int
    rate: float | None
    run_id: str
    logs: tuple[str, bool, str] = ("INFO", False, "text")
    """The run's logging (level, verbose, format): the helper's warnings read as its own."""
    probe_candidates: bool = False
    """Whether round 1 carries the helper's :class:`ProbeCandidates`: the run asks every bookie
    what it answers on a ledger it holds (:func:`~bklib.audit.engine.learns_capabilities`), and
    picks from every view, the helper's half included."""
    columnar: bool = False
    """Whether the helper keeps its half as rows only (:mod:`jobs.local.ledger_columns`), as
    the run does its own: the check reads metadata only."""


def _serve(conn: Connection, job: ShardJob) -> None:
    """The helper's life: scan, answer round 1, wait for the lost bookies, answer round 2."""
    # As in the run's own process (jobs.runtime.gc_pause): the views are long-lived and
    # acyclic, and the collector would walk them again and again as they pile up.
    gc.disable()
    interrupts.in_child()  # a Ctrl-C reaches the process group: the run stops its helper
    level, verbose, fmt = job.logs
    setup_logging(level, verbose=verbose, fmt=fmt)
    if progress_mode() == "bar":
        os.environ[PROGRESS_MODE_ENV] = "off"  # the run's own bar is on the same terminal
    try:
        set_request_rate(job.rate)
        # The helper process's one store session, for its scan and its check.
        with open_store(job.locator, auth=job.auth) as session:
            scanned = scan_dirs(session, job.dirs, max_in_flight=job.max_in_flight)
            table: pa.Table | None = None
            if job.columnar:
                columns = LedgerColumns(job.run_id)
                conn.send(("scan", columns.take(scanned)))
                table = columns.table()
                views: list[LedgerView] = []
            else:
                views = list(scanned)
                conn.send(("scan", ShardScan.of(views, probe=job.probe_candidates)))
            request = conn.recv()
            if request[0] != "check":
                return
            if table is not None:
                views = views_naming(table, request[1].lost)
            found, pairs = _check(session, views, request[1])
        if table is None:
            table = ledgers_table(job.run_id, views)
        views.clear()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        conn.send(("check", found, pairs, sink.getvalue().to_pybytes()))
    except BaseException as exc:  # noqa: BLE001 - everything goes back as one line
        # Fail closed: an error sends no partial answer, only the error, and the run raises
        # ScanHelperError on it (as on silence: a helper that dies answers EOF). Nothing the
        # helper read counts, so an error can never shrink the audit or pass as clean.
        with contextlib.suppress(OSError):  # the run may have stopped listening
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _check(
    session: MetadataStore, views: list[LedgerView], req: ShardCheck
) -> tuple[list[Finding], Counter[tuple[str, str]]]:
    """The helper's half of the check: its findings, and its (method, status) answers."""
    found: list[Finding] = []
    pairs: Counter[tuple[str, str]] = Counter()
    reads = req.reads
    if reads is None:  # metadata only
        for _, _, fs in check_ledgers(views, req.lost, req.check):
            found.extend(fs)
        return found, pairs
    with check_client(
        session, ledgers_root=reads.ledgers_root, settings=reads.settings, tls=reads.tls
    ) as client:
        checked = check_ledgers(views, req.lost, req.check, client=client, settings=reads.settings)
        for _, reports, fs in track(checked, len(views), f"{req.check} (helper)", logger=log):
            found.extend(fs)
            pairs.update((r.method, r.status) for r in reports)
    return found, pairs


class ScanShard:
    """The helper process, seen from the run: started on construction, scanning at once."""

    def __init__(self, job: ShardJob) -> None:
        ctx = multiprocessing.get_context("spawn")  # the run's process has threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, job), name="bkaudit-scan-helper")
        self._proc.start()
        child.close()
        self.dirs = job.dirs
        log.info(
            "metadata scan: a helper process scans %d of the directories (%d ledgers)",
            len(job.dirs),
            sum(d.count for d in job.dirs),
        )

    def _answer(self, kind: str) -> tuple[Any, ...]:
        try:
            answer: tuple[Any, ...] = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise ScanHelperError(
                f"the audit's helper process exited (code {self._proc.exitcode}) before "
                f"answering: {type(exc).__name__}"
            ) from None
        if answer[0] == "error":
            raise ScanHelperError(f"the audit's helper process failed: {answer[1]}")
        if answer[0] != kind:
            raise ScanHelperError(f"the audit's helper process answered {answer[0]}, not {kind}")
        return answer

    def scanned(self) -> ShardScan:
        """Round 1: wait for the helper's scan."""
        summary: ShardScan = self._answer("scan")[1]
        return summary

    def request_check(self, request: ShardCheck) -> None:
        """Round 2 begins: the helper checks its ledgers while the run checks its own."""
        self._conn.send(("check", request))

    def checked(self) -> tuple[list[Finding], Counter[tuple[str, str]], pa.Table]:
        """Round 2's answer: the helper's findings, its (method, status) answers, and its
        ``ledgers`` rows."""
        _, found, pairs, ipc = self._answer("check")
        with pa.ipc.open_stream(pa.py_buffer(ipc)) as reader:
            table = reader.read_all()
        return found, pairs, table

    def close(self) -> None:
        """Stop the helper (at once, if it is still working: the run has failed)."""
        if interrupts.stop_requested():  # the run was interrupted: no waiting for the helper
            self._proc.kill()
        try:
            if self._proc.is_alive():
                self._conn.send(("stop",))
        except OSError:
            pass
        self._conn.close()
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join()
