"""Helpers for the audit job's tests: one shared SparkSession, small hand-built DataFrames,
and real ledgers written to a sandbox (metadata with LedgerStore, entry bodies with
SyncBookieClient.add to each entry's write set)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from bklib.audit.engine import BookieRow
from bklib.audit.model import LedgerView
from bklib.bookie.faults import AdminClient
from bklib.client.operations import ClientConfig
from bklib.client.pool import SyncBookieClient
from bklib.digest import digest_manager, master_key
from bklib.meta.model import DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.store import LedgerStore
from bklib.meta.stores import MetadataStore, is_oxia, open_store
from bklib.quorum import write_set
from bklib.states import BookieState, ReplicaStatus
from bklib.testing.sandbox import OXIA, ZOOKEEPER, Sandbox
from bklib.testing.zkclient import connect
from jobs.commands.audit import add_audit_arguments
from jobs.commands.listing import add_list_arguments, run_listunderreplicated
from jobs.spark import load
from jobs.spark import schema as spark_schema

PASSWORD = b"audit-test"

_SPARK: SparkSession | None = None


def shared_spark() -> SparkSession:
    """The one SparkSession of the test process (local[2], tiny shuffles, no UI)."""
    global _SPARK
    if _SPARK is None:
        from jobs.spark.session import build_spark

        warehouse = tempfile.mkdtemp(prefix="bkaudit-spark-")
        _SPARK = build_spark(
            "bkaudit-tests",
            master="local[2]",
            overrides={
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "2",
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.warehouse.dir": os.path.join(warehouse, "spark-warehouse"),
                "spark.databricks.delta.snapshotPartitions": "1",
                "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "2",
                "spark.driver.memory": "1g",
                "spark.python.worker.reuse": "true",
            },
        )
    return _SPARK


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """Session fixture for test modules outside tests/spark (same shared session)."""
    return shared_spark()


# ---- hand-built DataFrames -----------------------------------------------------------------


def metadata(
    ledger_id: int,
    segments: Sequence[tuple[int, Sequence[str]]],
    *,
    e: int | None = None,
    wq: int = 2,
    aq: int = 2,
    last: int | None = None,
    state: LedgerState | None = None,
) -> LedgerMetadata:
    """Ledger metadata; CLOSED at ``last`` when ``last`` is given, else OPEN."""
    e = e if e is not None else len(segments[0][1])
    md = LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=e,
        write_quorum=wq,
        ack_quorum=aq,
        segments=tuple(Segment(f, tuple(b)) for f, b in segments),
        digest_type=DigestType.CRC32C,
        password=PASSWORD,
    )
    if last is not None:
        md = md.closed(last, (last + 1) * 10)
    if state is not None and state != md.state:
        md = md.replace(state=state)
    return md


def ledgers_df(spark: SparkSession, mds: Iterable[LedgerMetadata]) -> DataFrame:
    """A LEDGER_SCHEMA DataFrame from metadata objects."""
    names = spark_schema.LEDGER_SCHEMA.fieldNames()
    rows = [LedgerView.from_metadata(m, f"/ledgers/L{m.ledger_id}", 0).as_row() for m in mds]
    return spark.createDataFrame(
        [tuple(r[k] for k in names) for r in rows], spark_schema.LEDGER_SCHEMA
    )


def bookies_df(spark: SparkSession, writable: Iterable[str], lost: Iterable[str] = ()) -> DataFrame:
    rows = [BookieRow(b, BookieState.WRITABLE, None, None) for b in writable]
    rows += [BookieRow(b, BookieState.LOST, None, None, "not registered") for b in lost]
    return spark.createDataFrame([r.as_row() for r in rows], spark_schema.BOOKIE_SCHEMA)


def runs(*pairs: tuple[int, int]) -> list[dict[str, int]]:
    return [{"first_entry_id": a, "last_entry_id": b} for a, b in pairs]


def entry_row(
    ledger_id: int,
    bookie: str,
    held: Sequence[tuple[int, int]] = (),
    *,
    status: str = ReplicaStatus.OK,
    bad: Sequence[tuple[int, int]] = (),
    unknown: Sequence[tuple[int, int]] = (),
    lac: int | None = None,
    error: str | None = None,
) -> tuple[Any, ...]:
    return (
        ledger_id,
        bookie,
        status,
        "LIST",
        runs(*held),
        runs(*bad),
        runs(*unknown),
        lac,
        error,
    )


def entries_df(spark: SparkSession, rows: Iterable[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(list(rows), spark_schema.BOOKIE_ENTRIES_SCHEMA)


FINDING_COLUMNS = (
    "ledger_id",
    "segment_first_entry_id",
    "bookie_id",
    "reason",
    "missing_entries",
    "min_replicas",
    "severity",
)
FINDING_SCHEMA = T.StructType(
    [
        T.StructField("ledger_id", T.LongType(), False),
        T.StructField("segment_first_entry_id", T.LongType(), False),
        T.StructField("bookie_id", T.StringType(), False),
        T.StructField("reason", T.StringType(), False),
        T.StructField("missing_entries", T.LongType(), True),
        T.StructField("min_replicas", T.IntegerType(), True),
        T.StructField("severity", T.StringType(), True),
    ]
)


def findings(df: DataFrame) -> DataFrame:
    """The columns most tests compare, in FINDING_SCHEMA."""
    return df.select(*FINDING_COLUMNS)


def findings_df(spark: SparkSession, rows: Iterable[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(list(rows), FINDING_SCHEMA)


# ---- real ledgers on a sandbox ---------------------------------------------------------------


def write_ledger(
    store: LedgerStore,
    client: SyncBookieClient,
    md: LedgerMetadata,
    num_entries: int,
    *,
    skip: Iterable[tuple[int, str]] = (),
    payload: Callable[[int], bytes] | None = None,
) -> LedgerMetadata:
    """Create ``md`` in ZooKeeper and store entries ``0 .. num_entries-1`` on each entry's
    write set (from the segment holding the entry). ``skip`` lists (entry, bookie) replicas
    not to write; ``payload`` makes entry x's body (default: a line naming it). Entry bodies
    carry LAC = entry - 1, as a writer's would."""
    store.create_ledger(md)
    dm = digest_manager(md.ledger_id, md.digest_type or DigestType.CRC32C, md.password or b"")
    key = master_key(md.password or b"")
    skipped = set(skip)
    futures = []
    length = 0
    for x in range(num_entries):
        data = payload(x) if payload else f"ledger {md.ledger_id} entry {x}".encode()
        length += len(data)
        body = dm.package_entry(x, x - 1, length, data)
        ensemble = md.ensemble_for(x)
        for idx in write_set(x, md.ensemble_size, md.write_quorum):
            bookie = ensemble[idx]
            if (x, bookie) in skipped:
                continue
            futures.append(
                client.submit(
                    lambda p, b=bookie, x=x, body=body: p.add(b, md.ledger_id, x, key, body)
                )
            )
    for f in futures:
        f.result(30)
    return md


def audit_args(zk: str, warehouse: str, check: str, *extra: str) -> argparse.Namespace:
    """Parsed ``bkaudit audit`` arguments for a test (short timeouts)."""
    parser = add_audit_arguments(argparse.ArgumentParser())
    return parser.parse_args(
        [
            "--zk",
            zk,
            "--warehouse",
            warehouse,
            "--check",
            check,
            "--read-timeout",
            "2",
            "--connect-timeout",
            "2",
            *extra,
        ]
    )


def list_report(spark: SparkSession, warehouse: str, *extra: str) -> tuple[int, str]:
    """Run ``listunderreplicated`` in-process; returns (exit code, printed text)."""
    args = add_list_arguments(argparse.ArgumentParser()).parse_args(
        ["--warehouse", warehouse, *extra]
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_listunderreplicated(args)
    return code, out.getvalue()


def fragments_of(spark: SparkSession, warehouse: str, run_id: str) -> list[dict[str, Any]]:
    """The rows one run wrote to ``underreplicated_fragments``, as dicts."""
    return [
        r.asDict(recursive=True) for r in load.run_fragments(spark, warehouse, run_id).collect()
    ]


def by_position(value: Any, names: dict[str, str]) -> Any:
    """``value`` with every occurrence of each key of ``names`` replaced by its value, in
    strings, dicts and lists: bookie addresses become positions, so the rows of two clusters
    compare."""
    if isinstance(value, str):
        for old, new in names.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {k: by_position(v, names) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [by_position(v, names) for v in value]
    return value


@dataclass
class AuditCluster:
    """A sandbox (ZooKeeper chroot + Python bookies with fault injection) and clients."""

    sandbox: Sandbox
    store: LedgerStore
    client: SyncBookieClient

    @property
    def zk(self) -> str:
        return self.sandbox.zk_connect

    @property
    def bookie_ids(self) -> list[str]:
        return self.sandbox.bookie_ids

    def admin(self, bookie_id: str) -> AdminClient:
        return AdminClient.for_data_dir(self.sandbox.bookie(bookie_id).data_dir)

    def ledger(
        self,
        ensemble: Sequence[str] | Sequence[tuple[int, Sequence[str]]],
        num_entries: int,
        *,
        wq: int,
        aq: int,
        closed: bool = True,
        ledger_id: int | None = None,
    ) -> LedgerMetadata:
        """Write a ledger with ``num_entries`` entries; CLOSED at the last one unless
        ``closed`` is False. ``ensemble`` is one bookie list or (first entry, bookies) pairs.
        The id comes from the cluster's id generator unless ``ledger_id`` is given."""
        segs = ensemble if isinstance(ensemble[0], tuple) else [(0, ensemble)]
        lid = self.store.generate_ledger_id() if ledger_id is None else ledger_id
        md = metadata(lid, segs, wq=wq, aq=aq, last=num_entries - 1 if closed else None)  # type: ignore[arg-type]
        return write_ledger(self.store, self.client, md, num_entries)


@contextlib.contextmanager
def audit_cluster(base: Path, zk_chroot: str | None, bookies: int) -> Iterator[AuditCluster]:
    """Start a sandbox at the store ``zk_chroot`` locates (a ZooKeeper chroot, or an Oxia
    locator; None: on a ZooKeeper server of its own) and yield it with a metadata store and
    bookie client."""
    oxia = zk_chroot is not None and is_oxia(zk_chroot)
    sb = Sandbox(
        base,
        num_bookies=bookies,
        external_zk=zk_chroot,
        fault_injection=True,
        metadata=OXIA if oxia else ZOOKEEPER,
    )
    sb.start()
    zk: MetadataStore | KazooClient = (
        open_store(sb.zk_connect, timeout=15) if oxia else connect(sb.zk_connect)
    )
    config = ClientConfig(read_timeout=5.0, add_timeout=10.0, connect_timeout=5.0)
    client = SyncBookieClient(sb.zk_connect, config=config)
    try:
        yield AuditCluster(sb, LedgerStore(zk), client)
    finally:
        client.close()
        if isinstance(zk, MetadataStore):
            zk.close()
        else:
            zk.stop()
            zk.close()
        sb.stop()
