"""Rows become Arrow in batches (jobs.tables.delta.rows_to_arrow): the same table as one
conversion of the whole list, from a generator consumed once, in the table's schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from jobs.tables.delta import rows_to_arrow
from jobs.tables.schema import LEDGERS, TABLE_SCHEMAS


def _ledger_rows(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {
            "run_id": "r1",
            "ledger_id": i,
            "state": "CLOSED" if i % 3 else "OPEN",
            "ensemble_size": 3,
            "segments": [{"first_entry_id": 0, "last_entry_id": i, "ensemble": ["a:1", "b:2"]}],
        }


def test_batches_give_the_table_one_conversion_gives() -> None:
    schema = TABLE_SCHEMAS[LEDGERS]
    whole = pa.Table.from_pylist(list(_ledger_rows(7)), schema=schema)
    for per_batch in (1, 3, 7, 100):
        got = rows_to_arrow(_ledger_rows(7), schema, per_batch=per_batch)
        assert got.schema == schema
        assert got.equals(whole), per_batch
        assert got.to_batches()[0].num_rows == min(per_batch, 7)


def test_no_rows_is_an_empty_table_in_the_schema() -> None:
    schema = TABLE_SCHEMAS[LEDGERS]
    got = rows_to_arrow(iter(()), schema)
    assert got.num_rows == 0 and got.schema == schema
