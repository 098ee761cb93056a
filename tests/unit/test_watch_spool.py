"""The watch's spool (:mod:`jobs.watch.spool`): rows round-trip through a file with their
types, files flush oldest first and only once committed, new rows queue behind spooled
ones, and the bound stops the service without losing the rows that crossed it."""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS, LEDGERS, TABLE_SCHEMAS
from jobs.watch.spool import (
    SpoolBatch,
    SpoolError,
    SpoolFullError,
    SpoolWriter,
    decode_batch,
    decode_value,
    default_spool_dir,
    encode_batch,
    encode_value,
    spool_order,
)

T0 = datetime(2026, 11, 23, 21, 0, 0, 123456, tzinfo=timezone.utc)


def ledger_row() -> dict[str, Any]:
    return {
        "run_id": "r1",
        "ledger_id": 7,
        "znode_path": "/ledgers/00/0000/L0007",
        "znode_version": 3,
        "state": "CLOSED",
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "last_entry_id": 19,
        "length": 400,
        "digest_type": "CRC32C",
        "password": b"secret\x00\xff",
        "ctime": 1_700_000_000_000,
        "segments": [{"first_entry_id": 0, "last_entry_id": None, "ensemble": ["a:1", "b:2"]}],
        "error": None,
        "topic": "persistent://t/n/x",
        "component": None,
    }


def run_row(run_id: str = "r1") -> dict[str, Any]:
    return {
        "run_id": run_id,
        "started_at": T0,
        "finished_at": T0 + timedelta(seconds=3),
        "zk": "zk:2181/c",
        "check": "lost",
        "status": "COMPLETED",
        "counts": {"fragments": 2, "ledgers": 5},
        "error": None,
        "executor": "local",
    }


def action_row(run_id: str = "a1") -> dict[str, Any]:
    return {
        "run_id": run_id,
        "mode": "rereplicate",
        "audit_run_id": "r1",
        "ledger_id": 2**40 + 1,
        "segment_first_entry_id": 0,
        "segment_last_entry_id": 19,
        "old_bookie": "a:1",
        "new_bookie": "c:3",
        "action": "COPY",
        "entries_copied": 20,
        "bytes_copied": 4096,
        "no_replica_entries": [],
        "status": "DONE",
        "error": None,
        "started_at": T0,
        "finished_at": None,
        "executor": "local",
    }


def arrow(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=TABLE_SCHEMAS[table])


@pytest.mark.parametrize(
    "value",
    [
        T0,
        datetime(2026, 1, 1, 0, 0),
        date(2026, 11, 23),
        b"\x00\x01binary",
        None,
        True,
        -(2**62),
        1.5,
        "text",
        [1, None, 3],
        {"k": 1, "m": None},
        {"$ts": "not a timestamp"},  # a real map that looks like a tag
        [{"first_entry_id": 0, "last_entry_id": 4}],
    ],
)
def test_values_round_trip_with_their_types(value: Any) -> None:
    out = decode_value(encode_value(value))
    assert out == value and type(out) is type(value)
    if isinstance(value, datetime):
        assert out.tzinfo == value.tzinfo


def test_batches_round_trip_and_equal_the_arrow_rows_of_every_table() -> None:
    for table, rows in (
        (LEDGERS, [ledger_row()]),
        (AUDIT_RUNS, [run_row("r1"), run_row("r2")]),
        (ACTIONS, [action_row()]),
    ):
        batch = SpoolBatch(table, rows, date(2026, 11, 23), "/wh")
        back = decode_batch(encode_batch(batch))
        assert (back.table, back.run_date, back.warehouse) == (table, date(2026, 11, 23), "/wh")
        assert arrow(table, back.rows).equals(arrow(table, rows))


def test_the_password_never_reaches_the_disk() -> None:
    data = encode_batch(SpoolBatch(LEDGERS, [ledger_row()]))
    assert b"password" not in data and b"c2VjcmV0" not in data
    assert "password" not in decode_batch(data).rows[0]


def test_damaged_files_are_refused() -> None:
    good = encode_batch(SpoolBatch(AUDIT_RUNS, [run_row()]))
    with pytest.raises(ValueError):
        decode_batch(good.rsplit(b"\n", 2)[0] + b"\n")  # a row short of its header
    with pytest.raises(ValueError):
        decode_batch(b'{"format": 99, "table": "audit_runs"}\n')
    with pytest.raises(ValueError):
        decode_batch(b"")


def test_order_and_default_dir() -> None:
    names = [
        "00000000000000000020-7-audit_runs.jsonl",
        ".00000000000000000030-7-ledgers.jsonl.tmp",
        "00000000000000000010-9-replication_actions.jsonl",
        ".lock",
        "00000000000000000011-7-underreplicated_fragments.jsonl.bad",
    ]
    assert spool_order(names) == [
        "00000000000000000010-9-replication_actions.jsonl",
        "00000000000000000020-7-audit_runs.jsonl",
    ]
    assert default_spool_dir("/wh") == default_spool_dir("/wh/") != default_spool_dir("/wh2")


class Warehouse:
    """A warehouse that refuses appends while ``down``; records the appends it took."""

    def __init__(self) -> None:
        self.down = False
        self.appended: list[tuple[str, list[str]]] = []

    def append(self, _wh: str, table: str, rows: Any, run_date: date | None = None) -> int:
        if self.down:
            raise delta.TableError(f"Delta table /wh/{table}: Not a directory (os error 20)")
        rows = list(rows)
        self.appended.append((table, [r["run_id"] for r in rows]))
        return len(rows)

    def written(self, _wh: str, table: str, run_ids: Any) -> bool:
        return any(t == table and set(ids) & set(run_ids) for t, ids in self.appended)


def writer(tmp_path: Path, wh: Warehouse, max_bytes: int = 10**6) -> SpoolWriter:
    return SpoolWriter("/wh", tmp_path / "spool", max_bytes, wh.append, wh.written)


def test_failed_writes_are_spooled_and_flushed_in_order_behind_them(tmp_path: Path) -> None:
    wh = Warehouse()
    w = writer(tmp_path, wh)
    wh.down = True
    frag = {"run_id": "r1", "ledger_id": 1}
    assert w.write_many([(FRAGMENTS, [frag]), (LEDGERS, [ledger_row()])]) == [False, False]
    assert w.last_error is not None and "Not a directory" in w.last_error
    wh.down = False
    # The warehouse is back, but older rows wait: these go behind them, not before.
    assert w.flush()  # flushed first by write; then the run's audit_runs row
    assert w.write(AUDIT_RUNS, [run_row("r1")])
    assert [t for t, _ in wh.appended] == [FRAGMENTS, LEDGERS, AUDIT_RUNS]
    assert w.stats() == (0, 0, 0) and w.files() == []


def test_a_new_write_waits_behind_spooled_rows_while_the_flush_fails(tmp_path: Path) -> None:
    wh = Warehouse()
    w = writer(tmp_path, wh)
    wh.down = True
    w.write(LEDGERS, [ledger_row()])
    w.write(AUDIT_RUNS, [run_row("r1")])
    w.write(ACTIONS, [action_row("a1"), action_row("a1")])
    files, rows, size = w.stats()
    assert (files, rows) == (3, 4) and size > 0
    assert [p.name.split("-", 2)[2] for p in w.files()] == [
        "ledgers.jsonl",
        "audit_runs.jsonl",
        "replication_actions.jsonl",
    ]
    assert wh.appended == [] and not w.flush()
    wh.down = False
    assert w.flush()
    assert wh.appended == [(LEDGERS, ["r1"]), (AUDIT_RUNS, ["r1"]), (ACTIONS, ["a1", "a1"])]


def test_a_file_already_committed_is_not_appended_twice(tmp_path: Path) -> None:
    wh = Warehouse()
    w = writer(tmp_path, wh)
    wh.down = True
    w.write(AUDIT_RUNS, [run_row("r1")])
    # A crash between the commit and the unlink: the table has the run already.
    wh.appended.append((AUDIT_RUNS, ["r1"]))
    wh.down = False
    assert w.flush() and wh.appended == [(AUDIT_RUNS, ["r1"])]


def test_a_damaged_file_is_set_aside_and_the_rest_flushes(tmp_path: Path) -> None:
    wh = Warehouse()
    w = writer(tmp_path, wh)
    wh.down = True
    w.write(AUDIT_RUNS, [run_row("r1")])
    w.write(AUDIT_RUNS, [run_row("r2")])
    first = w.files()[0]
    first.write_bytes(first.read_bytes()[:-10])
    wh.down = False
    assert w.flush()
    assert wh.appended == [(AUDIT_RUNS, ["r2"])]
    assert os.path.exists(str(first) + ".bad")


def test_over_the_bound_the_rows_are_kept_and_the_service_stops(tmp_path: Path) -> None:
    wh = Warehouse()
    w = writer(tmp_path, wh, max_bytes=600)
    wh.down = True
    w.write(AUDIT_RUNS, [run_row("r1")])  # about 400 bytes: under the bound
    with pytest.raises(SpoolFullError, match="--spool-max-bytes 600") as err:
        w.write(AUDIT_RUNS, [run_row("r2")])
    assert isinstance(err.value, delta.TableError)
    assert "Not a directory" in str(err.value)
    assert w.stats()[:2] == (2, 2)  # the second file is kept: nothing lost
    # A restart with the warehouse back flushes both.
    wh.down = False
    assert writer(tmp_path, wh).flush()
    assert wh.appended == [(AUDIT_RUNS, ["r1"]), (AUDIT_RUNS, ["r2"])]


def test_real_delta_tables_take_the_spooled_rows_unchanged(tmp_path: Path) -> None:
    """Through delta-rs: the warehouse path under a regular file fails (even for root);
    made a directory again, the flushed rows read back equal to what was written."""
    blocker = tmp_path / "blocked"
    blocker.write_text("a file, not a directory")
    wh = str(blocker / "wh")
    w = SpoolWriter(wh, tmp_path / "spool", 10**6)
    assert w.write_many([(ACTIONS, [action_row("a1")])]) == [False]
    assert not w.write(AUDIT_RUNS, [run_row("r1")])
    assert w.stats()[:2] == (2, 2)
    blocker.unlink()
    blocker.mkdir()
    assert w.flush() and w.stats() == (0, 0, 0)
    got = delta.read_rows(wh, AUDIT_RUNS)
    assert len(got) == 1 and got[0]["finished_at"] == T0 + timedelta(seconds=3)
    assert dict(got[0]["counts"]) == {"fragments": 2, "ledgers": 5}
    actions = delta.read_rows(wh, ACTIONS)
    assert [(a["ledger_id"], a["bytes_copied"], a["run_date"]) for a in actions] == [
        (2**40 + 1, 4096, T0.date())
    ]


def test_rows_neither_written_nor_spooled_stop_the_service(tmp_path: Path) -> None:
    wh = Warehouse()
    wh.down = True
    (tmp_path / "file").write_text("x")
    w = SpoolWriter("/wh", tmp_path / "file" / "spool", 10**6, wh.append, wh.written)
    with pytest.raises(SpoolError, match="neither to the warehouse /wh") as err:
        w.write(AUDIT_RUNS, [run_row("r1")])
    assert not isinstance(err.value, SpoolFullError) and w.files() == []


def test_an_instance_that_never_spools_leaves_no_directory(tmp_path: Path) -> None:
    wh = Warehouse()
    w = writer(tmp_path, wh)
    assert w.write(AUDIT_RUNS, [run_row("r1")]) and w.flush()
    assert not (tmp_path / "spool").exists() and w.stats() == (0, 0, 0)


def test_rows_of_another_warehouse_are_set_aside_not_written(tmp_path: Path) -> None:
    wh = Warehouse()
    wh.down = True
    SpoolWriter("/other", tmp_path / "spool", 10**6, wh.append, wh.written).write(
        AUDIT_RUNS, [run_row("r1")]
    )
    wh.down = False
    w = writer(tmp_path, wh)
    assert w.flush() and wh.appended == [] and w.files() == []
    assert [p.suffix for p in (tmp_path / "spool").iterdir() if p.name != ".lock"] == [".foreign"]
