"""Interop cell 9: a ledger in metadata format v1, written as v1 by the Java client
(``ledgerMetadataVersion=1``), repaired by ``bkaudit rereplicate`` and read back by Java.

BookKeeper keeps a ledger's format version when it rewrites the metadata, and so must bklib:
after the repair (a bookie replaced in place) and the close of the ledger the Java writer left
open, both znodes are still v1 (no password, no digest type: ``--password-file`` and
``--digest-type`` supply them), the Java client reads every entry, and ``shell ledgermetadata``
prints ``formatVersion=1``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bklib.meta.model import LedgerState
from bklib.meta.serde import metadata_header
from jobs.commands.audit import run_audit
from jobs.tables import delta
from tests.audit_helpers import audit_args
from tests.cli_helpers import failure
from tests.interop.harness import REPO, JavaClient, b64, java_command, payloads, tail

pytestmark = pytest.mark.interop

PWD = b"v1-pwd"
DIGEST = "CRC32C"


def java_write_v1(classpath: str, uri: str, entries: list[bytes], *, close: bool, log: Path) -> int:
    """Create an E2/W2/A2 ledger with the Java client writing metadata format v1 (our
    MetadataTool); a ledger not closed is left open by a writer that halts."""
    cmd = java_command(
        classpath,
        "io.bkaudit.interop.MetadataTool",
        ["write", uri, "2", "2", "2", DIGEST, b64(PWD), "1", str(close).lower()],
    )
    with open(log, "ab") as err:
        res = subprocess.run(
            cmd,
            input="".join(b64(e) + "\n" for e in entries).encode(),
            stdout=subprocess.PIPE,
            stderr=err,
            timeout=180,
        )
    assert res.returncode == 0, tail(log)
    return int(res.stdout.decode().strip().splitlines()[-1])


@pytest.mark.timeout(900)  # slow when the machine is shared
def test_v1_ledgers_repaired_by_bkaudit_stay_v1(
    own_cluster: Any, bk_classpath: str, java_client: JavaClient, tmp_path: Path
) -> None:
    # The local executor (no Spark): the metadata path is the same engine either way
    # (docs/design: results are identical whichever executor runs them).
    # Three bookies (few JVMs: the suite shares two cores), ensembles of two.
    with own_cluster(java=3, init="java", bookie_conf={"zkTimeout": 4000}) as c:
        data: dict[int, list[bytes]] = {}
        for name, close in (("closed", True), ("open", False)):
            entries = payloads(f"v1-{name}", 30, size=300)
            lid = java_write_v1(
                bk_classpath, c.uri, entries, close=close, log=tmp_path / "v1-writer.log"
            )
            data[lid] = entries
        closed_id, open_id = data
        for lid in data:
            raw, _ = c.zk.get(c.store.path_for(lid))
            assert raw.startswith(metadata_header(1)), raw
        md_closed = c.store.read_ledger(closed_id).value
        md_open = c.store.read_ledger(open_id).value
        assert (md_closed.format_version, md_closed.state) == (1, LedgerState.CLOSED)
        assert (md_open.format_version, md_open.state) == (1, LedgerState.OPEN)
        assert md_closed.password is None and md_closed.digest_type is None

        # Two E=2 ensembles over three bookies share at least one: kill one they share; each
        # ledger then has one live bookie outside its ensemble to copy to.
        shared = sorted(set(md_closed.segments[0].ensemble) & set(md_open.segments[0].ensemble))
        victim_id = shared[0]
        victim = next(b for b in c.java if b.bookie_id == victim_id)
        victim.kill9()
        deadline = time.monotonic() + 30
        while c.zk.exists(f"/ledgers/available/{victim_id}") and time.monotonic() < deadline:
            time.sleep(0.2)  # waiting for the ZooKeeper session to expire
        assert not c.zk.exists(f"/ledgers/available/{victim_id}")

        warehouse = str(tmp_path / "warehouse")
        assert run_audit(audit_args(c.connect, warehouse, "lost", "--executor", "local")) == 0
        run = delta.latest_run(warehouse)
        assert run is not None
        rows = delta.run_fragments(warehouse, run["run_id"])
        got = {(r["ledger_id"], r["segment_first_entry_id"], r["bookie_id"]) for r in rows}
        assert got == {(closed_id, 0, victim_id), (open_id, 0, victim_id)}, rows

        password_file = tmp_path / "ledger-password"
        password_file.write_bytes(PWD)
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
                "--password-file",
                str(password_file),
                "--digest-type",
                DIGEST,
                "--executor",
                "local",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=600,
        )
        (tmp_path / "rereplicate.log").write_text(rerep.stdout + rerep.stderr)
        assert rerep.returncode == 0, failure(rerep, c.logs())

        live = set(c.java_ids) - {victim_id}
        for lid, entries in data.items():
            raw, _ = c.zk.get(c.store.path_for(lid))
            assert raw.startswith(metadata_header(1)), raw
            md = c.store.read_ledger(lid).value
            assert md.format_version == 1 and md.state is LedgerState.CLOSED, md
            assert md.last_entry_id == len(entries) - 1, md
            # Recovery of the open ledger may add a segment (an ensemble change while it
            # re-adds the tail past the victim); every segment is on live bookies.
            for seg in md.segments:
                assert set(seg.ensemble) <= live, md

            java = java_client.metadata(c.uri, lid)
            assert java["formatVersion"] == 1, java
            assert java["state"] == "CLOSED" and java["lastEntryId"] == len(entries) - 1, java
            assert java["digestType"] is None and java["password"] is None, java
            assert java["ensembles"] == {
                str(seg.first_entry_id): list(seg.ensemble) for seg in md.segments
            }, java
            got_entries, reply = java_client.read(c.uri, lid, password=PWD, digest=DIGEST)
            assert got_entries == entries, lid
            assert reply["metadata"]["formatVersion"] == 1

            out = c.shell.run("ledgermetadata", "-ledgerid", str(lid)).stdout
            # 4.16/4.17 print "ledgerID: 5"; 4.18 logs attributes ("ledgerID {ledgerId=5}").
            assert f"ledgerID: {lid}" in out or f"ledgerId={lid}" in out, out
            assert java["text"] in out, out
            assert "formatVersion=1" in out and "state=CLOSED" in out, out
