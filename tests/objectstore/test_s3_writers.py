"""Four writers commit to the same Delta tables on S3 at once, each at least 50 times, and no
commit is lost (docs/tables.md, "Object storage"): the watch (delta-rs) repairing a lost bookie
and auditing every few seconds, one-shot local audits (delta-rs), Spark audits in one
``local[2]`` driver (delta-spark, through bkaudit's conditional-PUT log store) and ``bkaudit
maintain`` compacting and vacuuming (delta-rs). Afterwards each table's history runs without a
gap, every run any writer reported is in ``audit_runs``, each run's rows are all there, and
the repair's actions are all there. (The same writers configured unsafely are refused:
tests/objectstore/test_s3_start.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bklib.states import CountKey
from bklib.testing.s3server import S3Server
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, BOOKIES, FRAGMENTS, LEDGERS
from jobs.tables.writer_tag import COMMAND_KEY
from tests.audit_helpers import audit_cluster
from tests.cli_helpers import REPO
from tests.integration.test_watch import ledgers, repaired, rows, wait_for, watching

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

COMMITS = 50
"""Commits each writer makes at least."""

RUNS = 18
"""Audits each audit writer runs: three commits each at least (ledgers, bookies, the run)."""

DEADLINE = 1200.0
"""Seconds the writers have to make their commits (Spark's driver runs that long at most)."""

TABLES = (AUDIT_RUNS, LEDGERS, BOOKIES, FRAGMENTS, ACTIONS)
SUMMARY = re.compile(r"^audit (\S+) (COMPLETED|FAILED|INCOMPLETE\S*):", re.M)


def _history(warehouse: str, table: str) -> list[dict[str, Any]]:
    if not delta.table_exists(warehouse, table):
        return []
    return list(delta.open_table(warehouse, table).history())


def _writer(commit: dict[str, Any]) -> str:
    """Which of the four made ``commit``: Spark says so in engineInfo, the delta-rs writers
    by bkaudit's commit tag, maintain by its operations."""
    if str(commit.get("engineInfo", "")).startswith("Apache-Spark"):
        return "spark"
    if commit.get("operation") in ("OPTIMIZE", "VACUUM START", "VACUUM END", "DELETE"):
        return "maintain"
    return str(commit.get(COMMAND_KEY, "other"))


def _commits(warehouse: str) -> Counter[str]:
    return Counter(_writer(c) for t in TABLES for c in _history(warehouse, t))


class _Loop(threading.Thread):
    """Runs ``argv`` again and again until ``until()`` says stop; keeps stdout."""

    def __init__(
        self,
        argv: list[str],
        until: Any,
        runs: int | None = None,
        pause: float = 0.0,
        timeout: float = 600.0,
    ) -> None:
        super().__init__(daemon=True)
        self.argv, self.until, self.runs, self.pause = argv, until, runs, pause
        self.timeout = timeout
        self.out: list[str] = []
        self.codes: list[int] = []

    def run(self) -> None:
        while not self.until() and (self.runs is None or len(self.codes) < self.runs):
            proc = subprocess.run(
                self.argv, cwd=REPO, capture_output=True, text=True, timeout=self.timeout
            )
            self.codes.append(proc.returncode)
            self.out.append(proc.stdout + proc.stderr)
            time.sleep(self.pause)


def test_four_writers_on_one_s3_warehouse_lose_no_commit(
    tmp_path: Path, zk_chroot: str, s3_env: S3Server, bucket: str
) -> None:
    wh = f"{bucket}/wh"
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=4, entries=10)]
        cli = [sys.executable, "-m", "jobs.cli"]
        done = threading.Event()
        # Spark is the slowest writer (about 8 s an audit on idle cores, 40 s when the two
        # cores are shared with the other writers and another test): its driver starts first,
        # and each other writer stops once it has made its commits, so that the last part of
        # the test is Spark and the watch alone.
        spark = _Loop([sys.executable, "-m", "tests.objectstore.spark_audit_loop", c.zk, wh,
                       str(RUNS)], done.is_set, runs=1, timeout=DEADLINE)  # fmt: skip
        spark.start()
        with watching(
            c.zk, wh, tmp_path, "w1", "--every", "lost=8s", "--lost-bookie-recovery-delay", "0s",
        ) as w:  # fmt: skip
            w.wait_role("leader")
            wait_for(lambda: rows(wh, AUDIT_RUNS), 60, "the take-over audit's row", w)
            c.sandbox.kill_bookie(victim)
            audits = _Loop([*cli, "audit", "--zk", c.zk, "--warehouse", wh, "--check", "lost",
                            "--executor", "local"], done.is_set, runs=RUNS, pause=5.0)  # fmt: skip
            maintain = _Loop(
                [*cli, "maintain", "--warehouse", wh, "--keep", "365d"],
                lambda: done.is_set() or _commits(wh)["maintain"] >= COMMITS,
                pause=15.0,
            )
            for loop in (audits, maintain):
                loop.start()
            deadline = time.monotonic() + DEADLINE
            writers = {"audit": audits, "spark": spark, "maintain": maintain}
            while time.monotonic() < deadline:
                ended = [k for k, t in writers.items() if not t.is_alive()]
                counts = _commits(wh)  # after is_alive: an ended writer's commits are all in
                if all(counts[k] >= COMMITS for k in ("watch", "audit", "spark", "maintain")):
                    break
                if any(counts[k] < COMMITS for k in ended):
                    break  # a loop ended short: the assertion below says which
                time.sleep(5)
            done.set()
            for loop in (audits, spark, maintain):
                loop.join(600)
            wait_for(lambda: repaired(c, ids, victim), 120, "the watch's repair", w)
            m = w.metrics()
    assert w.proc.returncode == 0, w.tail()
    counts = _commits(wh)
    assert all(counts[k] >= COMMITS for k in ("watch", "audit", "spark", "maintain")), counts
    assert set(audits.codes) <= {0, 1} and set(maintain.codes) <= {0}, (
        audits.codes, maintain.codes, audits.out[-1:], maintain.out[-1:],
    )  # fmt: skip
    assert spark.codes == [0], spark.out
    # Every table's history runs from version 0 without a gap: no commit file was replaced.
    for table in TABLES:
        versions = sorted(h["version"] for h in _history(wh, table))
        assert versions == list(range(len(versions))), (table, versions)
    # Every run each writer reported is in audit_runs, and nothing else is.
    reported = {rid for out in audits.out + spark.out for rid, _ in SUMMARY.findall(out)}
    watch_runs = int(sum(v for k, v in m.items() if k.startswith("bkaudit_audit_runs_total")))
    runs = rows(wh, AUDIT_RUNS)
    ids_in_table = {r["run_id"] for r in runs}
    assert reported <= ids_in_table, reported - ids_in_table
    # The watch's runs: all it had counted when scraped, and at most the one that was under
    # way then (stopping the watch records it, INTERRUPTED or finished).
    after_scrape = len(runs) - len(reported) - watch_runs
    assert after_scrape in (0, 1), (len(runs), len(reported), watch_runs)
    # Each run's rows: every ledger and every fragment it counted.
    led = Counter(r["run_id"] for r in rows(wh, LEDGERS))
    frag = Counter(r["run_id"] for r in rows(wh, FRAGMENTS))
    for r in runs:
        n = dict(r["counts"])
        assert led[r["run_id"]] == n[CountKey.LEDGERS], (r["run_id"], led[r["run_id"]], n)
        assert frag[r["run_id"]] == n.get(CountKey.FRAGMENTS, 0), (r["run_id"], n)
    written = sum(v for k, v in m.items() if k.startswith("bkaudit_repair_actions_total"))
    assert len(rows(wh, ACTIONS)) == written > 0
