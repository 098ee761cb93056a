"""A scan kept as the ``ledgers`` table's rows (jobs/local/ledger_columns.py) answers what the
views did: the lost check's findings, the scan's summary, and each ledger's bookies for the
index."""

from __future__ import annotations

import pytest

from bklib.audit.classify import classify_ledger
from bklib.audit.model import LedgerView
from bklib.meta import paths
from bklib.testing.scale.plan import ScalePlan
from jobs.local import ledger_columns
from jobs.local.ledger_columns import LedgerColumns, scanned_ledgers, views_naming
from jobs.local.scan_summary import ShardScan
from jobs.tables.ledgers_arrow import ledgers_table

BOOKIES = tuple(f"10.0.{i // 250}.{i % 250}:3181" for i in range(12))


def _views(n: int) -> list[LedgerView]:
    plan = ScalePlan(ledgers=n, bookies=BOOKIES)
    views = [
        LedgerView.from_metadata(lp.metadata, paths.ledger_path("/ledgers", lp.ledger_id), 0)
        for lp in plan
    ]
    views[3] = LedgerView.unreadable(views[3].ledger_id, views[3].znode_path, "garbage")
    return views


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_columns, "CHUNK", 97)  # several chunks, one of them partial


def test_the_lost_checks_findings_are_the_views_findings() -> None:
    views = _views(1000)
    columns = LedgerColumns("r1")
    summary = columns.take(iter(views))
    table = columns.table()
    assert table.num_rows == 1000
    assert table.equals(ledgers_table("r1", views))
    lost = frozenset(BOOKIES[:2])
    naming = views_naming(table, lost)
    expected = [v for v in views if v.ok and any(b in lost for b in v.bookies())]
    assert 0 < len(naming) < len(views)
    assert [v.ledger_id for v in naming] == [v.ledger_id for v in expected]
    by_views = [f for v in views if v.ok for f in classify_ledger(v, lost, None)]
    by_columns = [f for v in naming for f in classify_ledger(v, lost, None)]
    assert by_columns and by_columns == by_views
    whole = ShardScan.of(views)
    assert summary.named == whole.named and summary.per_directory == whole.per_directory
    assert (summary.ledgers, summary.metadata_errors, summary.not_closed) == (
        whole.ledgers,
        whole.metadata_errors,
        whole.not_closed,
    )
    assert summary.unreadable == whole.unreadable == [(views[3].ledger_id, "garbage")]


def test_no_lost_bookie_and_no_rows_name_nothing() -> None:
    views = _views(50)
    table = ledgers_table("r1", views)
    assert views_naming(table, frozenset()) == []
    assert views_naming(table, frozenset({"10.9.9.9:3181"})) == []
    empty = LedgerColumns("r1")
    assert empty.take(iter(())).ledgers == 0
    assert views_naming(empty.table(), frozenset(BOOKIES)) == []


def test_the_index_reads_each_ledgers_bookies_from_the_rows() -> None:
    views = _views(500)
    columns = LedgerColumns("r1")
    columns.take(iter(views))
    got = [(s.ledger_id, set(s.bookies()), s.ok) for s in scanned_ledgers(columns.table())]
    assert got == [(v.ledger_id, set(v.bookies()), v.ok) for v in views]
