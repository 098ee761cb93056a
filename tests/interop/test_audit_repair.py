"""Interop cell 5: the full story on an all-Java cluster.

Java writes ledgers to four Java bookies (DbLedgerStorage, which does not answer list-entries,
so the audit must fall back to probe reads); one bookie is killed; ``bkaudit audit --check
replicas`` reports exactly the fragments that used it; ``bkaudit rereplicate`` repairs them
onto the surviving Java bookies (fencing and closing the ledger a Java writer left open); the
Java client then reads every entry, and a second audit finds nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.meta.model import LedgerState
from jobs.commands.audit import run_audit
from jobs.spark import load
from tests.audit_helpers import audit_args, fragments_of
from tests.audit_helpers import spark as spark  # the session fixture
from tests.cli_helpers import failure
from tests.interop.autorecovery_tools import write_story_ledgers
from tests.interop.harness import REPO, JavaClient

pytestmark = pytest.mark.interop

PWD = b"story-pwd"


@pytest.mark.timeout(900)  # two audits and a Spark job; slow when the machine is shared
def test_audit_and_rereplicate_java_cluster(
    own_cluster: Any, java_client: JavaClient, spark: SparkSession, tmp_path: Path
) -> None:
    # Short ZooKeeper sessions: the killed bookie's registration goes within seconds.
    with own_cluster(java=4, init="bklib", bookie_conf={"zkTimeout": 4000}) as c:
        j0, j1, j2, j3 = c.java_ids
        story = write_story_ledgers(java_client, c.uri, c.java_ids, PWD)
        data = dict(story.values())
        ids = {name: lid for name, (lid, _) in story.items()}

        victim = c.java[0]
        victim.kill9()
        deadline = time.monotonic() + 30
        while c.zk.exists(f"/ledgers/available/{j0}") and time.monotonic() < deadline:
            time.sleep(0.2)  # waiting for the ZooKeeper session to expire
        assert not c.zk.exists(f"/ledgers/available/{j0}")

        # Exactly the segments that used the victim, computed from the metadata.
        expected = set()
        for lid in data:
            md = c.store.read_ledger(lid).value
            for seg in md.segments:
                if j0 in seg.ensemble:
                    expected.add((lid, seg.first_entry_id, j0))
        assert {lid for lid, _, _ in expected} == {ids[k] for k in ("e3w2", "e3w3", "e2w2", "open")}

        warehouse = str(tmp_path / "warehouse")
        assert run_audit(audit_args(c.connect, warehouse, "replicas"), spark) == 0
        run = load.latest_run(spark, warehouse)
        assert run is not None
        rows = fragments_of(spark, warehouse, run["run_id"])
        got = {(r["ledger_id"], r["segment_first_entry_id"], r["bookie_id"]) for r in rows}
        assert got == expected, (rows, c.logs())
        assert {r["reason"] for r in rows} == {"BOOKIE_LOST"}, rows
        # The live Java bookies were checked by probe reads (no list-entries on DbLedgerStorage)
        # and nothing was missing on them.
        assert run["counts"].get("pairs_PROBE_OK", 0) > 0, run["counts"]

        env = {**os.environ, "PYTHONPATH": str(REPO)}
        rerep = subprocess.run(
            [
                sys.executable,
                "-m",
                "jobs.cli",
                "rereplicate",
                "--zk",
                c.connect,
                "--warehouse",
                warehouse,
                "--grace-period",
                "0s",
                "--master",
                "local[2]",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=600,
        )
        (tmp_path / "rereplicate.log").write_text(rerep.stdout + rerep.stderr)
        assert rerep.returncode == 0, failure(rerep, c.logs())

        live = {j1, j2, j3}
        for lid, entries in data.items():
            md = c.store.read_ledger(lid).value
            assert md.state is LedgerState.CLOSED, md
            assert md.last_entry_id == len(entries) - 1, md
            for seg in md.segments:
                assert set(seg.ensemble) <= live, md
            got_entries, reply = java_client.read(c.uri, lid, password=PWD)
            assert got_entries == entries, lid
            # Java's reads go to the replacement too: read each replacement's copies directly
            # by reading with only the new ensemble (the victim is gone, so every read that
            # succeeded came from live bookies).
            assert reply["metadata"]["state"] == "CLOSED"

        assert run_audit(audit_args(c.connect, warehouse, "replicas"), spark) == 0
        again = load.latest_run(spark, warehouse)
        assert again is not None and again["run_id"] != run["run_id"]
        assert fragments_of(spark, warehouse, again["run_id"]) == []
