"""Faults of an S3 warehouse (docs/tables.md, "Object storage"; docs/watch.md, "Unreachable
warehouse"), each against the real S3-compatible server, through a proxy where the fault needs
one:

- the store unreachable for a minute: the watch repairs anyway, spools its rows, and writes
  them later in order; a one-shot audit fails with one line and leaves no partial commit;
- a writer SIGKILLed while its commit is on its way: the table stays readable and the next
  writer goes on, whether the commit landed or not.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bklib.testing.s3server import S3Server
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS, LEDGERS
from tests.audit_helpers import AuditCluster, audit_cluster
from tests.cli_helpers import REPO, bkaudit, failure, one_error_line
from tests.integration.test_watch import (
    assert_clean,
    ledgers,
    repaired,
    rows,
    settled,
    wait_for,
    watching,
)
from tests.objectstore.conftest import aws_env, use_aws_env
from tests.objectstore.proxy import S3Proxy, s3_proxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

OUTAGE = 60.0
"""How long the store stays unreachable in the watch's test: "a minute"."""


def _versions_in_order(warehouse: str, table: str) -> list[str]:
    """The run ids of ``table`` in the order their rows were committed."""
    from deltalake import DeltaTable

    from jobs.tables.object_store import delta_storage_options

    path = delta.table_path(warehouse, table)
    dt = DeltaTable(path, storage_options=delta_storage_options(path))
    seen: list[str] = []
    for version in range(dt.version() + 1):
        dt.load_as_version(version)
        ids = dt.to_pyarrow_table(columns=["run_id"]).column("run_id").to_pylist()
        seen += sorted(set(ids) - set(seen))
    return seen


def test_the_watch_spools_through_a_minute_without_s3_and_writes_later_in_order(
    tmp_path: Path, zk_chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool"
    with S3Server(tmp_path / "s3") as s3:
        use_aws_env(monkeypatch, aws_env(s3))
        wh = s3.make_bucket("outage") + "/wh"
        with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
            victim = c.bookie_ids[3]
            ids = [md.ledger_id for md in ledgers(c, victim, n=2, entries=10)]
            with watching(
                c.zk, wh, tmp_path, "w1", "--lost-bookie-recovery-delay", "0s",
                "--spool-dir", str(spool),
            ) as w:  # fmt: skip
                w.wait_role("leader")
                wait_for(lambda: rows(wh, AUDIT_RUNS), 30, "the take-over audit's row", w)
                s3.stop()
                down_at = time.monotonic()
                c.sandbox.kill_bookie(victim)
                wait_for(lambda: repaired(c, ids, victim), 90, "repair without S3", w)
                wait_for(lambda: settled(w.metrics()), 90, "the clean re-audit", w)
                code, body = w.get("/readyz")
                assert (code, json.loads(body)["detail"]) == (503, "warehouse unreachable")

                def spooled() -> Counter[str]:
                    files = sorted(n for n in os.listdir(spool) if n.endswith(".jsonl"))
                    return Counter(n.split("-", 2)[2].removesuffix(".jsonl") for n in files)

                # The clean re-audit's rows are written beside the cycle (a loss's audit rows
                # never hold up its repair): spooled a moment after the metrics say settled.
                wait_for(lambda: spooled()[AUDIT_RUNS] >= 2, 30, "the re-audit's rows", w)
                tables = spooled()
                assert tables[AUDIT_RUNS] >= 2 and tables[ACTIONS] >= 1, tables
                time.sleep(max(0.0, OUTAGE - (time.monotonic() - down_at)))
                m = w.metrics()
                audits = sum(v for k, v in m.items() if k.startswith("bkaudit_audit_runs_total"))
                written = sum(
                    v for k, v in m.items() if k.startswith("bkaudit_repair_actions_total")
                )
                s3.start()  # the same port: the store is back
                wait_for(lambda: w.metrics().get("bkaudit_spooled_files") == 0, 60, "flush", w)
                assert w.get("/readyz")[0] == 200
            assert w.proc.returncode == 0, w.tail()
            assert_clean(c, ids, victim)
        runs = rows(wh, AUDIT_RUNS)
        assert len(runs) == audits, (len(runs), audits)  # none lost
        assert len(rows(wh, ACTIONS)) == written
        # Written later, in the order they were spooled: the runs' commits follow their starts.
        order = _versions_in_order(wh, AUDIT_RUNS)
        started = {r["run_id"]: r["started_at"] for r in runs}
        assert [started[r] for r in order] == sorted(started[r] for r in order)
        # Every ledger each run read: all of them for a scan, the index's for a loss's run.
        led = Counter(r["run_id"] for r in rows(wh, LEDGERS))
        assert all(led[r["run_id"]] == dict(r["counts"])["ledgers"] for r in runs), (led, runs)
        full = [r for r in runs if "ledgers_from_index" not in dict(r["counts"])]
        assert full and all(led[r["run_id"]] == len(ids) for r in full), (led, full)
    log = w.log.read_text()
    assert "spooled" in log and "writable again" in log


def _audit_args(zk: str, warehouse: str) -> list[str]:
    return ["audit", "--zk", zk, "--warehouse", warehouse, "--check", "replicas"]


@contextmanager
def _audited_through_a_proxy(
    tmp_path: Path, zk_chroot: str, s3: S3Server, wh: str
) -> Iterator[tuple[AuditCluster, S3Proxy, dict[str, str]]]:
    """A cluster of three bookies and a few ledgers, audited once into ``wh`` through an
    :class:`S3Proxy` in front of ``s3``: the cluster, the proxy, the environment using it."""
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=3) as c:
        ledgers(c, c.bookie_ids[2], n=3, entries=5)
        with s3_proxy(s3) as proxy:
            env = aws_env(s3, AWS_ENDPOINT_URL=proxy.endpoint)
            first = bkaudit(*_audit_args(c.zk, wh), env=env, timeout=180)
            assert first.returncode == 0, failure(first)
            yield c, proxy, env


def test_a_one_shot_audit_without_s3_fails_in_one_line_leaving_no_partial_commit(
    tmp_path: Path, zk_chroot: str, s3_env: S3Server, bucket: str
) -> None:
    s3 = s3_env
    wh = f"{bucket}/wh"
    with _audited_through_a_proxy(tmp_path, zk_chroot, s3, wh) as (c, proxy, env):
        before = {t: len(rows(wh, t)) for t in (AUDIT_RUNS, LEDGERS)}
        # The store goes away at the run's first data file: after the start-up probe.
        proxy.hold = ("PUT", re.compile(r"\.parquet"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", *_audit_args(c.zk, wh)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proxy.held.wait(120), proc.communicate()
        proxy.go_away()
        proxy.release(forward=False)
        out, err = proc.communicate(timeout=240)
        # One line and exit 2, naming the table and the store's failure.
        line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        assert f"{wh}/" in line and "Connection refused" in line, line
        # Readable, and nothing of the failed run committed.
        after = {t: len(rows(wh, t)) for t in (AUDIT_RUNS, LEDGERS)}
        assert after == before, (after, before)
        again = bkaudit(*_audit_args(c.zk, wh), env=aws_env(s3), timeout=180)
        assert again.returncode == 0, failure(again)
    assert len(rows(wh, AUDIT_RUNS)) == before[AUDIT_RUNS] + 1


@pytest.mark.parametrize("lands", [True, False], ids=["commit-lands", "commit-lost"])
def test_a_writer_killed_mid_commit_leaves_the_table_readable_and_the_next_goes_on(
    tmp_path: Path, zk_chroot: str, s3_env: S3Server, bucket: str, lands: bool
) -> None:
    s3 = s3_env
    wh = f"{bucket}/wh"
    with _audited_through_a_proxy(tmp_path, zk_chroot, s3, wh) as (c, proxy, env):
        # Held: the next commit of the fragments table (its _delta_log/N.json).
        proxy.hold = ("PUT", re.compile(rf"/{FRAGMENTS}/_delta_log/\d+\.json"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", *_audit_args(c.zk, wh)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert proxy.held.wait(120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proxy.release(forward=lands)
        time.sleep(1.0)  # the held request, forwarded or dropped, is done
        # Readable, at whichever version, with the first run's rows whole.
        (first,) = rows(wh, AUDIT_RUNS)
        for table, key in ((LEDGERS, "ledgers"), (FRAGMENTS, "fragments")):
            kept = [f for f in rows(wh, table) if f["run_id"] == first["run_id"]]
            assert len(kept) == dict(first["counts"])[key], (table, first)
        versions = [h["version"] for h in delta.open_table(wh, FRAGMENTS).history()]
        assert sorted(versions) == list(range(max(versions) + 1)), versions
        again = bkaudit(*_audit_args(c.zk, wh), env=env, timeout=180)
        assert again.returncode == 0, failure(again)
        listing = bkaudit("listunderreplicated", "--warehouse", wh, env=env)
        assert listing.returncode in (0, 1), failure(listing)
    completed = [r for r in rows(wh, AUDIT_RUNS) if r["status"] == "COMPLETED"]
    assert len(completed) == 2  # the first and the next; the killed one never finished
