"""Helpers for the repair jobs' tests: parsed arguments, in-process runs, and checks that
every replica of every entry holds the right bytes."""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Any

from pyspark.sql import SparkSession

from bklib.client.pool import SyncBookieClient
from bklib.client.reader import read_entries_blocking
from bklib.digest import digest_manager
from bklib.meta.model import DigestType, LedgerMetadata
from bklib.meta.store import LedgerStore
from bklib.quorum import write_set
from jobs.commands.repair import (
    MODE_REREPLICATE,
    RUNNERS,
    add_repair_arguments,
)
from jobs.spark import load
from tests.audit_helpers import PASSWORD


def repair_args(mode: str, *argv: str) -> argparse.Namespace:
    """Parsed ``bkaudit <mode>`` arguments."""
    return add_repair_arguments(argparse.ArgumentParser(), mode).parse_args(list(argv))


def run_repair(
    spark: SparkSession, zk: str, warehouse: str, *extra: str, mode: str = MODE_REREPLICATE
) -> tuple[int, str]:
    """Run a repair command in-process with short timeouts; returns (exit code, output)."""
    argv = [*extra, "--zk", zk, "--warehouse", warehouse, "--read-timeout", "3"]
    argv += ["--zk-session-timeout", "4s"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = RUNNERS[mode](repair_args(mode, *argv), spark)
    return code, out.getvalue()


def actions_of(spark: SparkSession, warehouse: str) -> list[dict[str, Any]]:
    """Every row of ``replication_actions``."""
    if not load.table_exists(spark, warehouse, load.ACTIONS):
        return []
    return [
        r.asDict(recursive=True) for r in load.read_table(spark, warehouse, load.ACTIONS).collect()
    ]


def audit_and_fragments(
    spark: SparkSession, zk: str, warehouse: str, check: str = "lost", executor: str = "local"
) -> list[dict[str, Any]]:
    """Run an audit in-process (the local executor unless told otherwise: these audits set up
    and verify repairs; the Spark audit has tests of its own and the executors' differential
    test) and return the fragments it wrote."""
    from jobs.commands.audit import run_audit
    from tests.audit_helpers import audit_args, fragments_of

    assert run_audit(audit_args(zk, warehouse, check, "--executor", executor), spark) == 0
    run = load.latest_run(spark, warehouse)
    assert run is not None
    return fragments_of(spark, warehouse, run["run_id"])


def payload(ledger_id: int, entry_id: int) -> bytes:
    """What :func:`tests.audit_helpers.write_ledger` stores in an entry."""
    return f"ledger {ledger_id} entry {entry_id}".encode()


def assert_fully_replicated(
    store: LedgerStore,
    client: SyncBookieClient,
    ledger_id: int,
    *,
    excluded: frozenset[str] = frozenset(),
) -> LedgerMetadata:
    """Every entry up to lastEntryId is on *every* bookie of its write set, with a valid digest
    and the expected payload; no write set names an ``excluded`` bookie. A fresh reader also
    reads the whole ledger. Returns the metadata."""
    md = store.read_ledger(ledger_id).value
    assert md.is_closed, f"ledger {ledger_id} is {md.state.name}"
    assert not (md.bookies() & excluded), (
        f"ledger {ledger_id} still names {md.bookies() & excluded}"
    )
    dm = digest_manager(ledger_id, md.digest_type or DigestType.CRC32C, md.password or PASSWORD)
    for eid in range(md.last_entry_id + 1):
        ensemble = md.ensemble_for(eid)
        for idx in write_set(eid, md.ensemble_size, md.write_quorum):
            bookie = ensemble[idx]
            body = client.read(bookie, ledger_id, eid).body
            view = dm.verify_entry(body, eid)
            assert bytes(view.payload) == payload(ledger_id, eid), (ledger_id, eid, bookie)
    if md.last_entry_id >= 0:
        entries = read_entries_blocking(client, store, ledger_id, 0, md.last_entry_id)
        assert [e.payload for e in entries] == [
            payload(ledger_id, x) for x in range(md.last_entry_id + 1)
        ]
    return md


class SyncWriter:
    """A live :class:`~bklib.client.writer.LedgerWriter` driven from a test thread: it runs on
    the SyncBookieClient's event loop, as an application's writer would run on its own."""

    def __init__(self, store: LedgerStore, client: SyncBookieClient, ensemble: list[str]):
        from bklib.client.placement import PlacementPolicy
        from bklib.client.reader import ClientContext
        from bklib.client.writer import LedgerWriter

        class _First(PlacementPolicy):  # the test picks the ensemble
            def new_ensemble(self, candidates, size, exclude=()):  # type: ignore[no-untyped-def]
                return tuple(ensemble[:size])

        async def create(pool: Any) -> LedgerWriter:
            ctx = ClientContext(store, pool, _First())
            return await LedgerWriter.create(
                ctx,
                ensemble_size=len(ensemble),
                write_quorum=2,
                ack_quorum=2,
                digest_type=DigestType.CRC32C,
                password=PASSWORD,
            )

        self.client = client
        self.writer = client.run(create)

    @property
    def ledger_id(self) -> int:
        return self.writer.ledger_id

    def add(self) -> int:
        """Add the next entry (payload as :func:`payload` expects); returns its id."""
        w = self.writer

        async def add(_pool: Any) -> int:
            return await w.add(payload(w.ledger_id, w.last_add_pushed + 1))

        return self.client.run(add)

    def close(self) -> LedgerMetadata:
        w = self.writer

        async def close(_pool: Any) -> LedgerMetadata:
            return await w.close()

        return self.client.run(close)
