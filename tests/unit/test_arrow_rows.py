"""Arrow back to rows (jobs.tables.delta.arrow_rows): exactly ``to_pylist``'s rows, with the
UTC timestamps made by addition instead of through the time zone database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa

from jobs.tables.delta import arrow_rows
from jobs.tables.schema import ACTIONS, FRAGMENTS, TABLE_SCHEMAS


def _fragments() -> pa.Table:
    t0 = datetime(2026, 11, 28, 23, 59, 59, 999_999, tzinfo=timezone.utc)
    rows = [
        {"run_id": f"r{i}", "check": "lost", "detected_at": t0 + timedelta(microseconds=i),
         "ledger_id": i, "segment_index": 0, "segment_first_entry_id": 0, "bookie_index": 1,
         "bookie_id": "b:1", "reason": "LOST_BOOKIE",
         "missing_ranges": [{"first_entry_id": 0, "last_entry_id": i}],
         "first_detected_at": None if i % 2 else datetime(1969, 7, 20, tzinfo=timezone.utc)}
        for i in range(5)
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=TABLE_SCHEMAS[FRAGMENTS])


def test_the_rows_to_pylist_gives_timestamps_and_nulls_included() -> None:
    table = _fragments()
    got = arrow_rows(table)
    assert got == table.to_pylist()
    assert [list(r) for r in got] == [list(r) for r in table.to_pylist()]  # column order
    assert got[1]["first_detected_at"] is None
    assert got[0]["first_detected_at"] == datetime(1969, 7, 20, tzinfo=timezone.utc)
    assert got[4]["detected_at"].isoformat() == "2026-11-29T00:00:00.000003+00:00"
    assert got[0]["missing_ranges"] == [{"first_entry_id": 0, "last_entry_id": 0}]


def test_other_time_zones_and_units_and_empty_tables() -> None:
    t = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    table = pa.table(
        {
            "paris": pa.array([t], pa.timestamp("us", tz="Europe/Paris")),
            "ms": pa.array([t], pa.timestamp("ms", tz="UTC")),
            "naive": pa.array([t.replace(tzinfo=None)], pa.timestamp("us")),
        }
    )
    assert arrow_rows(table) == table.to_pylist()
    assert arrow_rows(table.slice(0, 0)) == []
    empty = pa.Table.from_pylist([], schema=TABLE_SCHEMAS[ACTIONS])
    assert arrow_rows(empty) == []
