"""One audit's steps over ZooKeeper and the bookies, for either executor.

The local executor calls these in-process over the whole cluster; the Spark executor calls the
same functions inside its tasks, each over its share of the ledger tree. Both therefore read the
same ledgers, ask the bookies the same questions and reach the same verdicts.

Steps: plan the scan from the ledger tree's directories; read each ledger's metadata; list the
bookies (a bookie named in an ensemble but not registered is lost); ask the bookies
(:class:`~bklib.audit.checker.ReplicaChecker`); classify
(:func:`~bklib.audit.classify.classify_ledger`); re-read the flagged ledgers and drop findings
whose ledger changed meanwhile.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bklib.audit.accounting import ScanAccount, account_scan
from bklib.audit.capabilities import DEFAULT_PROBE_TIMEOUT, learn_capabilities, probe_targets
from bklib.audit.checker import CheckSettings
from bklib.audit.checks import check as check_kind
from bklib.audit.model import Finding, LedgerView, ReplicaReport
from bklib.client.operations import ClientConfig, run_client_config
from bklib.client.pool import SyncBookieClient
from bklib.errors import BKError
from bklib.meta.cluster import ClusterLayout
from bklib.meta.paths import LayoutKind
from bklib.meta.registration import BookieRegistry
from bklib.meta.scan import DEFAULT_MAX_IN_FLIGHT, read_ledgers_by_id, scan_directories
from bklib.meta.store import LeafDir, LedgerStore
from bklib.meta.stores import MetadataStore
from bklib.states import DEFAULT_LEDGERS_ROOT, BookieState, Check, CountKey, parse_host_port
from bklib.tls import TlsSettings

__all__ = [
    "BookieRow",
    "ScanPlan",
    "bookie_client_config",
    "bookie_rows",
    "capability_counts",
    "check_client",
    "check_ledgers",
    "learn_bookies",
    "learns_capabilities",
    "lost_bookies",
    "plan_scan",
    "read_ledgers",
    "require_cluster",
    "scan_dirs",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScanPlan:
    """The ledger tree's leaf directories and the layout, read once by the driver."""

    dirs: tuple[LeafDir, ...]
    kind: LayoutKind

    @property
    def expected(self) -> int:
        """Ledger znodes the directory stats announced."""
        return sum(d.count for d in self.dirs)

    @classmethod
    def read(cls, session: MetadataStore, root: str = DEFAULT_LEDGERS_ROOT) -> ScanPlan:
        """Check the cluster and list its leaf directories, over the run's session."""
        store = LedgerStore(session, root)
        store.require_cluster(session.locator.rstrip("/"))
        return cls(tuple(store.leaf_dirs()), store.kind)

    def account(
        self,
        session: MetadataStore,
        scanned: Mapping[str, int],
        root: str = DEFAULT_LEDGERS_ROOT,
    ) -> ScanAccount:
        """After a scan: re-read the directories' child versions and account for every
        announced ledger (:func:`~bklib.audit.accounting.account_scan`). ``scanned`` is the
        number of ledgers the scan produced per directory."""
        versions = LedgerStore(session, root, kind=self.kind).dir_versions(
            d.path for d in self.dirs
        )
        account = account_scan(self.dirs, versions, scanned)
        (log.info if account.complete else log.error)("metadata scan: %s", account.describe())
        return account


def require_cluster(session: MetadataStore, root: str = DEFAULT_LEDGERS_ROOT) -> ClusterLayout:
    """Raise :class:`~bklib.errors.ClusterNotFoundError` unless a BookKeeper cluster (of
    BookKeeper's or Pulsar's driver) is at ``session`` / ``root``; return which (see
    :meth:`LedgerStore.require_cluster`)."""
    return LedgerStore(session, root).require_cluster(session.locator.rstrip("/"))


def plan_scan(dirs: Sequence[LeafDir], groups: int) -> list[list[LeafDir]]:
    """Spread the directories over at most ``groups`` groups of similar ledger counts
    (largest first, each to the lightest group)."""
    groups = max(1, min(groups, len(dirs)))
    heap: list[tuple[int, int]] = [(0, k) for k in range(groups)]
    out: list[list[LeafDir]] = [[] for _ in range(groups)]
    for d in sorted(dirs, key=lambda d: -d.count):
        load, k = heapq.heappop(heap)
        out[k].append(d)
        heapq.heappush(heap, (load + d.count, k))
    for g in out:
        g.sort(key=lambda d: d.path)
    return [g for g in out if g]


def _view(r: Any) -> LedgerView:
    if r.metadata is None:
        return LedgerView.unreadable(r.ledger_id, r.path, str(r.error))
    return LedgerView.from_metadata(r.metadata, r.path, r.version)


def scan_dirs(
    session: MetadataStore,
    dirs: Iterable[LeafDir],
    *,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
) -> Iterator[LedgerView]:
    """Every ledger under ``dirs``, read over the process's store session.
    A corrupt or unreadable key is a view whose error names it; a ledger deleted meanwhile is
    skipped. A directory that cannot be read (other than deleted) raises: an audit never
    shrinks silently."""
    dirs = list(dirs)
    if not dirs:
        return
    for r in scan_directories(session, dirs, max_in_flight):
        yield _view(r)


def read_ledgers(
    session: MetadataStore,
    ledger_ids: Iterable[int],
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    kind: LayoutKind = LayoutKind.HIERARCHICAL,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
) -> dict[int, LedgerView | None]:
    """Read the given ledgers now: each id maps to its view, or None when it was deleted."""
    wanted = sorted(set(ledger_ids))
    out: dict[int, LedgerView | None] = dict.fromkeys(wanted)
    for r in read_ledgers_by_id(session, wanted, root=root, kind=kind, max_in_flight=max_in_flight):
        out[r.ledger_id] = _view(r)
    return out


@dataclass(frozen=True)
class BookieRow:
    """A row of the ``bookies`` table."""

    bookie_id: str
    state: str
    host: str | None
    port: int | None
    error: str | None = None
    list_entries: bool | None = None
    """Answers GET_LIST_OF_ENTRIES_OF_LEDGER (None: not asked, or no answer)."""
    batch_read: bool | None = None
    """Serves the v2 BATCH_READ (None: not asked, or no answer)."""

    def as_row(self) -> dict[str, Any]:
        return dict(self.__dict__)


def bookie_rows(registry: BookieRegistry, named: Iterable[str]) -> list[BookieRow]:
    """Registered bookies (writable / readonly) and lost ones: named in some ensemble of a
    readable ledger but not registered."""
    rows = []
    registered = registry.all()
    for bid, reg in sorted(registered.items()):
        host, port = parse_host_port(bid) or (None, None)
        if reg.info is not None:
            with contextlib.suppress(BKError):
                host, port = reg.info.rpc_address()
        state = BookieState.READONLY if reg.readonly else BookieState.WRITABLE
        rows.append(BookieRow(bid, state, host, port, reg.error))
    for bid in sorted(set(named) - set(registered)):
        host, port = parse_host_port(bid) or (None, None)
        rows.append(
            BookieRow(bid, BookieState.LOST, host, port, "named in an ensemble but not registered")
        )
    return rows


def learns_capabilities(check: str) -> bool:
    """Whether ``check`` asks the bookies what they answer before reading (:func:`learn_bookies`):
    replicas and deep do; the sample check reads single entries and asks nothing, and the lost
    check reads no bookie (:attr:`~bklib.audit.checks.AuditCheck.learns_capabilities`)."""
    return check_kind(check).learns_capabilities


def learn_bookies(
    client: Any,
    rows: Sequence[BookieRow],
    ledgers: Iterable[LedgerView] | Mapping[str, int],
    settings: CheckSettings,
    check: str = Check.REPLICAS,
) -> tuple[list[BookieRow], CheckSettings]:
    """Ask each reachable bookie once what it answers (:mod:`bklib.audit.capabilities`), on a
    ledger it holds: ``ledgers`` are the views to pick from, or the picks (bookie -> ledger).
    Returns the rows with the answers and the check settings that carry them to every task.
    Only ``replicas`` asks for list-entries; the sample check reads single entries and asks
    nothing."""
    if not learns_capabilities(check):
        return list(rows), settings
    live = [r.bookie_id for r in rows if r.state != BookieState.LOST]
    targets = (
        {b: lid for b, lid in ledgers.items() if b in live}
        if isinstance(ledgers, Mapping)
        else probe_targets(ledgers, live)
    )
    caps = learn_capabilities(
        client,
        targets,
        min(DEFAULT_PROBE_TIMEOUT, settings.read_timeout),
        ask_list=check_kind(check).ask_list,
    )
    out = [
        replace(r, list_entries=c.list_entries, batch_read=c.batch_read)
        if (c := caps.get(r.bookie_id)) is not None
        else r
        for r in rows
    ]
    settings = replace(
        settings,
        no_list=settings.no_list | {b for b, c in caps.items() if c.list_entries is False},
        batch_read=settings.batch_read | {b for b, c in caps.items() if c.batch_read},
    )
    return out, settings


def capability_counts(rows: Iterable[BookieRow]) -> dict[str, int]:
    """``audit_runs.counts`` entries of the capability probe."""
    rows = list(rows)
    return {
        CountKey.BOOKIES_NO_LIST_ENTRIES: sum(1 for r in rows if r.list_entries is False),
        CountKey.BOOKIES_BATCH_READ: sum(1 for r in rows if r.batch_read),
    }


def bookie_client_config(settings: CheckSettings, tls: TlsSettings | None = None) -> ClientConfig:
    """The bookie client configuration of an audit's questions: the check's timeouts in
    :func:`~bklib.client.operations.run_client_config`, the one builder every run uses."""
    return run_client_config(
        read_timeout=settings.read_timeout, connect_timeout=settings.connect_timeout, tls=tls
    )


def check_client(
    session: MetadataStore,
    *,
    ledgers_root: str,
    settings: CheckSettings,
    tls: TlsSettings | None = None,
) -> SyncBookieClient:
    """The bookie client a check reads with, the same in every executor and process (the run,
    the local helper, a Spark task): :func:`bookie_client_config`, and the check's
    ``bookie_protocol`` for entry reads. It resolves bookie addresses over the process's
    store session, opening none of its own."""
    return SyncBookieClient(
        session,
        ledgers_root=ledgers_root,
        config=bookie_client_config(settings, tls),
        protocol=settings.bookie_protocol,
    )


def lost_bookies(rows: Iterable[BookieRow]) -> frozenset[str]:
    """The ids of the lost bookies among ``rows``."""
    return frozenset(r.bookie_id for r in rows if r.state == BookieState.LOST)


def check_ledgers(
    ledgers: Iterable[LedgerView],
    lost: frozenset[str],
    check: str,
    *,
    client: Any = None,
    settings: CheckSettings | None = None,
    on_checker: Any = None,
) -> Iterator[tuple[LedgerView, list[ReplicaReport], list[Finding]]]:
    """Each readable ledger with what its bookies answered and its findings.

    The check's kind runs it (:meth:`~bklib.audit.checks.AuditCheck.check_ledgers`): ``lost``
    reads metadata only, ``client`` unused; the others ask the bookies with ``client``, a
    :class:`~bklib.client.pool.SyncBookieClient`; ``on_checker`` (optional) receives the
    checker, so a caller can read what it learnt about each bookie afterwards.
    """
    yield from check_kind(check).check_ledgers(
        ledgers, lost, client=client, settings=settings, on_checker=on_checker
    )
