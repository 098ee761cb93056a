"""The local audit's rows (jobs/local/audit.py): the helper's ``ledgers`` rows, kept as Arrow,
become dicts only for a caller that reads them (``rows``); ``load`` writes the Arrow table as
it is and must not convert half a million rows to drop them."""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pytest

from bklib.audit.engine import ScanPlan
from bklib.meta.paths import LayoutKind
from bklib.meta.stores import MetadataStore
from bklib.states import Check
from jobs.local import audit as local_audit
from jobs.local.audit import LocalAudit
from jobs.runs.audit_run import AuditConfig
from jobs.tables.schema import LEDGERS, RUN_DATE


def test_the_helpers_rows_are_converted_only_when_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    calls: list[int] = []
    real = local_audit.delta.arrow_rows

    def counted(table: pa.Table, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append(table.num_rows)
        return real(table, *args, **kwargs)

    monkeypatch.setattr(local_audit.delta, "arrow_rows", counted)
    config = AuditConfig(zk="127.0.0.1:1", warehouse=str(tmp_path), check=Check.LOST)
    # Building rows reads no store: the session is never touched here.
    job = LocalAudit(config, ScanPlan((), LayoutKind.HIERARCHICAL), cast(MetadataStore, None))
    job.shard_ledgers = pa.table({"run_id": ["r", "r"], "ledger_id": [7, 8], RUN_DATE: ["d", "d"]})
    sources = dict(job.row_sources({}))
    assert calls == []  # nothing converted while the rows are only named
    rows = list(sources[LEDGERS])
    assert calls == [2]
    assert rows == [{"run_id": "r", "ledger_id": 7}, {"run_id": "r", "ledger_id": 8}]
