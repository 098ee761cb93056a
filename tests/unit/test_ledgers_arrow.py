"""The ledgers table built column by column (jobs.tables.ledgers_arrow) is the table the rows
make (jobs.tables.delta.rows_to_arrow): open, closed, multi-segment, unreadable and Pulsar
ledgers alike."""

from __future__ import annotations

from bklib.audit.model import LedgerView
from bklib.meta.model import DigestType, LedgerMetadata, Segment
from jobs.tables.delta import rows_to_arrow
from jobs.tables.ledgers_arrow import ledgers_table
from jobs.tables.schema import LEDGERS, TABLE_SCHEMAS


def _views() -> list[LedgerView]:
    ens = ("a:1", "b:2", "c:3")
    md = LedgerMetadata(
        ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2,
        segments=(Segment(0, ens), Segment(10, ("a:1", "d:4", "c:3"))),
        digest_type=DigestType.CRC32C, password=b"pw", ctime=123,
        custom_metadata={"application": b"pulsar", "component": b"managed-ledger",
                         "pulsar/managed-ledger": b"t/n/persistent/x"},
    )  # fmt: skip
    return [
        LedgerView.from_metadata(md.closed(25, 999), "/ledgers/00/0000/L0007", 3),
        LedgerView.from_metadata(md, "/ledgers/00/0000/L0008", 0),  # open: last segment unknown
        LedgerView.unreadable(9, "/ledgers/00/0000/L0009", "corrupt metadata at ..."),
        LedgerView(ledger_id=10),  # nothing known but the id
    ]


def test_columns_equal_rows() -> None:
    views = _views()
    schema = TABLE_SCHEMAS[LEDGERS]
    expected = rows_to_arrow(({"run_id": "r1", **v.as_row()} for v in views), schema)
    got = ledgers_table("r1", views)
    assert got.schema == expected.schema
    assert got.to_pylist() == expected.to_pylist()
    assert got.equals(expected)
    assert got.column("segments").to_pylist()[1][-1]["last_entry_id"] is None
    assert got.column("segments").null_count == 2


def test_no_views_no_rows() -> None:
    assert ledgers_table("r1", []).num_rows == 0
    assert ledgers_table("r1", [LedgerView(ledger_id=1)]).column("segments").null_count == 1
