"""``bkaudit blastradius`` on both executors writes the same ``blast_radius`` rows.

One sandbox (real ZooKeeper, five Python bookies) with topics, racks, a multi-segment ledger,
an open ledger, entries missing on one replica and a lost bookie; the latest audit's findings
count as gone. The local path, ``--executor spark`` and ``auto`` above ``--local-max-ledgers``
must agree row for row (once run ids, times and the executor are set aside). The merge of
partial results is also checked over more partitions than the sandbox's scan makes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.audit.blast_radius import blast_radius
from bklib.audit.engine import ScanPlan, scan_dirs
from bklib.audit.whatif import current_missing
from bklib.meta.stores import open_store
from jobs.commands.blastradius import add_blastradius_arguments, run_blastradius
from jobs.commands.whatif import findings_missing, load_state
from jobs.runtime.exit_status import ExitStatus
from jobs.spark.blast_radius import blast_radius_df
from jobs.spark.schema import LEDGER_SCHEMA
from jobs.tables import delta
from jobs.tables.schema import BLAST_RADIUS
from tests.audit_helpers import AuditCluster, audit_args, audit_cluster, metadata, write_ledger
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration

VOLATILE = {"run_id", "computed_at", "executor"}


def _topic_ledger(c: AuditCluster, bookies: list[str], n: int, topic: str) -> int:
    lid = c.store.generate_ledger_id()
    md = metadata(lid, [(0, bookies)], wq=2, aq=2, last=n - 1)
    custom = {"component": b"managed-ledger", "pulsar/managed-ledger": topic.encode()}
    write_ledger(c.store, c.client, md.replace(custom_metadata=custom), n)
    return lid


def _build(c: AuditCluster) -> None:
    b = c.bookie_ids
    for k in range(5):
        _topic_ledger(c, [b[k], b[(k + 1) % 5], b[(k + 2) % 5]], 20 + k, f"t/ns/persistent/x{k}")
    c.ledger([(0, [b[0], b[1], b[2]]), (12, [b[3], b[1], b[2]])], 30, wq=2, aq=2)
    c.ledger([b[1], b[2], b[3]], 15, wq=2, aq=2, closed=False)
    c.ledger([b[2], b[4]], 9, wq=1, aq=1)
    c.ledger([b[0], b[4]], 9, wq=2, aq=1)
    partial = c.ledger([b[0], b[1], b[3]], 30, wq=2, aq=2)
    c.admin(b[3]).delete_entries(partial.ledger_id, [1, 2, 3, 10])
    doc = {"default": {b[0]: {"rack": "/r1"}, b[1]: {"rack": "/r1"}, b[2]: {"rack": "/r2"}}}
    c.store.zk.create("/bookies", json.dumps(doc).encode())
    c.sandbox.stop_bookie(b[4])
    c.sandbox.wait_unregistered(b[4])


def _blast(zk: str, wh: Path, spark: Any, *flags: str, code: int = 0) -> tuple[str, str]:
    argv = ["--zk", zk, "--warehouse", str(wh), *flags]
    args = add_blastradius_arguments(argparse.ArgumentParser()).parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        got = run_blastradius(args, spark)
    assert got == code, out.getvalue() + err.getvalue()
    return out.getvalue(), err.getvalue()


def _runs(wh: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in delta.read_rows(str(wh), BLAST_RADIUS):
        runs.setdefault(r["run_id"], []).append(r)
    return runs


def _norm(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        ({k: v for k, v in r.items() if k not in VOLATILE} for r in rows),
        key=lambda r: (r["scope"], r["name"]),
    )


def test_local_and_spark_blast_radius_rows_are_equal(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    wh = tmp_path / "wh"
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=5) as c:
        _build(c)
        from jobs.commands.audit import run_audit

        with contextlib.redirect_stdout(io.StringIO()):
            assert run_audit(audit_args(c.zk, str(wh), "replicas", "--executor", "local")) == 0

        out, err = _blast(c.zk, wh, None, "--executor", "local")
        assert "[local]" in out and "INCOMPLETE" not in err
        out, err = _blast(c.zk, wh, spark, "--executor", "spark")
        assert "[spark]" in out and "INCOMPLETE" not in err
        # auto: Spark above the local limit (the shared session is the one getOrCreate finds)
        out, _ = _blast(c.zk, wh, None, "--executor", "auto", "--local-max-ledgers", "1")
        assert "[spark]" in out
        out, _ = _blast(c.zk, wh, None, "--executor", "auto")
        assert "[local]" in out

        runs = sorted(_runs(wh).values(), key=lambda rs: rs[0]["computed_at"])
        assert [rs[0]["executor"] for rs in runs] == ["local", "spark", "spark", "local"]
        want = _norm(runs[0])
        for rs in runs[1:]:
            assert _norm(rs) == want
        assert all(r["audit_run_id"] for r in want)
        by = {(r["scope"], r["name"]): r for r in want}
        assert by[("rack", "/r1")]["bookies"] == 2
        assert any(r["entries_lost"] for r in want) and any(r["topics"] for r in want)
        assert any(r["ledgers_entries_unknown"] for r in want)

        # More partitions than the sandbox's scan makes: the partial results still merge.
        with open_store(c.zk) as session:
            state = load_state(session, warehouse=str(wh))
            plan = ScanPlan.read(session)
            views = list(scan_dirs(session, plan.dirs))
        assert state.missing and state.lost == {c.bookie_ids[4]}
        local = blast_radius(
            state.views,
            state.bookies,
            racks=state.racks,
            gone=state.lost,
            missing=state.missing,
            writable=state.writable,
        )
        df = spark.createDataFrame([v.as_row() for v in views], LEDGER_SCHEMA).repartition(3)
        assert df.rdd.getNumPartitions() == 3
        found, _ = findings_missing(str(wh))
        assert current_missing(found, views) == state.missing
        remote = blast_radius_df(
            df,
            state.bookies,
            racks=state.racks,
            gone=state.lost,
            missing=found,
            writable=state.writable,
            min_racks=2,
        )
        assert remote == local

        # Fail closed: a ledger whose metadata cannot be read may name any bookie, so both
        # executors still write their rows but exit 3 (incomplete) and name the ledger (a
        # lower bound).
        bad = c.ledger([c.bookie_ids[0], c.bookie_ids[1]], 4, wq=2, aq=2)
        c.store.zk.set(c.store.path_for(bad.ledger_id), b"BookieMetadataFormatVersion\t3\n\x05junk")
        for executor, session in (("local", None), ("spark", spark)):
            out, err = _blast(c.zk, wh, session, "--executor", executor, code=ExitStatus.INCOMPLETE)
            assert f"[{executor}]" in out
            assert "INCOMPLETE: 1 ledgers could not be read" in err
            assert f"({bad.ledger_id})" in err
