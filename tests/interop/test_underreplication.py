"""Interop cell 6: under-replication coexistence with Java autorecovery.

Marks published by bkaudit appear in the Java shell's ``listunderreplicated``; a ledger locked
by bkaudit is never taken by a Java ReplicationWorker (``AutoRecoveryMain``), while the worker
does take (and finish) the others; and a ledger the Java worker holds cannot be acquired by
bkaudit, neither by the library nor by the ``bkaudit rereplicate`` job, which skips it as
LOCKED and leaves it untouched. The cluster is private (bklib-initialised, Python bookies,
Java writers) so the Auditor and worker touch nothing of the other tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.meta import LedgerMetadata, Segment
from bklib.meta.model import DigestType, LedgerState
from bklib.meta.underreplication import UnderReplicationManager
from jobs.commands.audit import run_audit
from tests.audit_helpers import audit_args
from tests.audit_helpers import spark as spark  # the session fixture
from tests.interop.autorecovery_tools import parse_listunderreplicated, wait_until
from tests.interop.harness import REPO, AutoRecovery, JavaClient, payloads

pytestmark = pytest.mark.interop

PWD = b"ur-pwd"
GONE = "127.0.0.1:1"  # a bookie id nobody registers: "lost"


@pytest.mark.timeout(900)  # an audit and a Spark job; slow when the machine is shared
def test_marks_and_locks_shared_with_java_autorecovery(
    own_cluster: Any,
    java_client: JavaClient,
    bk_classpath: str,
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    with own_cluster(python=3, init="bklib") as c:
        urm = UnderReplicationManager(c.zk, "/ledgers", worker_id="bkaudit-interop")
        urm.ensure_layout()
        locked = java_client.write(c.uri, payloads("ur-locked", 20), password=PWD)
        free = java_client.write(c.uri, payloads("ur-free", 20), password=PWD)
        # An open ledger whose last ensemble has a bookie that is gone: a Java worker holds
        # its lock for openLedgerRereplicationGracePeriod before touching it.
        held = c.store.generate_ledger_id()
        c.store.create_ledger(
            LedgerMetadata(
                ledger_id=held,
                ensemble_size=3,
                write_quorum=2,
                ack_quorum=2,
                segments=(Segment(0, (c.python_ids[0], c.python_ids[1], GONE)),),
                digest_type=DigestType.CRC32C,
                password=PWD,
                ctime=int(time.time() * 1000),
                store_ctime=True,
            )
        )
        for lid in (locked, free, held):
            assert urm.mark_underreplicated(lid, [GONE])
        assert urm.mark_underreplicated(locked, ["127.0.0.1:2"])  # merged into the mark

        out = c.shell.run("listunderreplicated", "-printmissingreplica").stdout
        assert parse_listunderreplicated(out) == {
            locked: {GONE, "127.0.0.1:2"},
            free: {GONE},
            held: {GONE},
        }, out

        lock = urm.try_acquire(locked)
        assert lock is not None
        ar = AutoRecovery(
            bk_classpath,
            c.uri,
            c.base / "autorecovery",
            extra={
                "openLedgerRereplicationGracePeriod": 600000,
                "lostBookieRecoveryDelay": 0,
                "rwRereplicateBackoffMs": 500,
            },
        )
        ar.start()
        try:
            # The Java worker finishes the free ledger (nothing is really missing on it) ...
            wait_until(lambda: urm.get(free) is None, 90, "the Java worker to finish", ar.log_tail)
            # ... and takes the held one, keeping its lock through the grace period.
            holder = wait_until(lambda: urm.lock_holder(held), 60, "the Java lock", ar.log_tail)
            assert holder != "bkaudit-interop"
            assert urm.try_acquire(held) is None, "bkaudit took a ledger the Java worker holds"
            java_lock = c.zk.exists(f"/ledgers/underreplication/locks/urL{held:010d}")
            assert java_lock is not None
            assert java_lock.ephemeralOwner != c.zk.client_id[0]

            # Ours was never taken: same lock znode (our session), mark unchanged.
            time.sleep(2)  # give the worker more polls at it
            ours = c.zk.exists(f"/ledgers/underreplication/locks/urL{locked:010d}")
            assert ours is not None and ours.ephemeralOwner == c.zk.client_id[0], ar.log_tail()
            assert urm.lock_holder(locked) == "bkaudit-interop"
            mark = urm.get(locked)
            assert mark is not None and set(mark.missing_replicas) == {GONE, "127.0.0.1:2"}
            assert f"ledger id is: {locked}\n" not in ar.log_path.read_text(), ar.log_tail()
            out = c.shell.run("listunderreplicated", "-printmissingreplica").stdout
            assert set(parse_listunderreplicated(out)) == {locked, held}, out

            # The repair job finds the held ledger (a lost bookie in its open last segment)
            # and, with no grace period, would fence it: the Java lock makes it skip instead.
            before = c.store.read_ledger(held)
            warehouse = str(tmp_path / "warehouse")
            assert run_audit(audit_args(c.connect, warehouse, "lost"), spark) == 0
            job = subprocess.run(
                [sys.executable, "-m", "jobs.cli", "rereplicate", "--zk", c.connect,
                 "--warehouse", warehouse, "--grace-period", "0s", "--master", "local[2]"],
                capture_output=True, text=True, cwd=REPO, timeout=600,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )  # fmt: skip
            (tmp_path / "rereplicate.log").write_text(job.stdout + job.stderr)
            assert job.returncode == 1, (job.stdout, job.stderr[-3000:])
            assert re.search(r"SKIP\s+LOCKED", job.stdout), job.stdout
            assert str(held) in job.stdout.split("ledgers needing another run:")[1], job.stdout
            after = c.store.read_ledger(held)
            assert after.version == before.version and after.value.state is LedgerState.OPEN
            assert urm.lock_holder(held) == holder
        finally:
            ar.stop()
        urm.release(lock)
