"""whatif, blastradius, topics and triage on a real sandbox: real ZooKeeper (and, for the
first test, real Oxia), Python bookie processes, Delta tables through delta-rs, and the
``bkaudit`` command in a subprocess.

Ledgers (bookies b0..b3; Pulsar-shaped custom metadata written by bklib's metadata writer):

* L1 [b0, b1] 2/2/2, topic T1 (managed-ledger)
* L2 [b1, b2, b3] 3/3/2, topic T2 (managed-ledger)
* L3 [b2] 1/1/1 (write quorum one, no topic)
* L4 [b0, b1] 2/2/2, entry 3 written nowhere (lost on every replica)
* L5 [b0, b1] 2/2/1, entry 0 written nowhere, deleted after the audit
* L6 [b0, b1, b2, b3] 4/4/2: no bookie left outside its ensemble to replace b2
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bklib.meta.model import LedgerMetadata
from jobs.tables import delta
from jobs.tables.schema import BLAST_RADIUS, FRAGMENTS, LEDGERS, TRIAGE
from tests.audit_helpers import AuditCluster, audit_cluster, metadata, write_ledger
from tests.cli_helpers import bkaudit, error_lines

pytestmark = pytest.mark.integration

T1 = "persistent://acme/orders/created"
T2 = "persistent://acme/orders/paid-partition-0"


def _custom(ml: str) -> dict[str, bytes]:
    return {
        "application": b"pulsar",
        "component": b"managed-ledger",
        "pulsar/managed-ledger": ml.encode(),
    }


def _ledger(
    c: AuditCluster,
    bookies: list[str],
    n: int,
    wq: int,
    aq: int,
    custom: dict[str, bytes] | None = None,
    skip: list[tuple[int, str]] | None = None,
) -> LedgerMetadata:
    lid = c.store.generate_ledger_id()
    md = metadata(lid, [(0, bookies)], wq=wq, aq=aq, last=n - 1)
    md = md.replace(custom_metadata=custom or {}, ctime=1_700_000_000_000, store_ctime=True)
    return write_ledger(c.store, c.client, md, n, skip=skip or ())


def _run(*args: str, ok: tuple[int, ...] = (0,)) -> Any:
    proc = bkaudit(*args)
    assert proc.returncode in ok, proc.stdout + proc.stderr
    return proc


def test_whatif_blastradius_topics_and_triage(tmp_path: Path, store_locator: str) -> None:
    """The same answers on ZooKeeper and on Oxia (``--zk`` takes either locator)."""
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", store_locator, bookies=4) as c:
        b0, b1, b2, b3 = c.bookie_ids
        l1 = _ledger(c, [b0, b1], 10, 2, 2, _custom("acme/orders/persistent/created"))
        l2 = _ledger(c, [b1, b2, b3], 6, 3, 2, _custom("acme/orders/persistent/paid-partition-0"))
        l3 = _ledger(c, [b2], 5, 1, 1)
        l4 = _ledger(c, [b0, b1], 6, 2, 2, skip=[(3, b0), (3, b1)])
        l5 = _ledger(c, [b0, b1], 4, 2, 1, skip=[(0, b0), (0, b1)])
        l6 = _ledger(c, [b0, b1, b2, b3], 8, 4, 2)
        zk = c.zk

        # ---- whatif on the healthy cluster ----------------------------------------------
        p = _run("whatif", "--zk", zk, "--bookie", b0, "--exit-code", ok=(1,))
        assert "verdict: UNSAFE" in p.stdout
        assert f"ledger {l1.ledger_id}" in p.stdout and T1 in p.stdout
        p = _run("whatif", "--zk", zk, "--bookie", b0)  # without --exit-code: 0, verdict shown
        assert "verdict: UNSAFE" in p.stdout
        p = _run("whatif", "--zk", zk, "--bookie", b3, "--exit-code")
        assert "verdict: SAFE" in p.stdout, p.stdout  # L2 and L6 keep AQ on 2+ replicas
        p = _run("whatif", "--zk", zk, "--bookie", b2, "--exit-code", ok=(1,))
        assert f"ledger {l3.ledger_id}  5 entries lost [0-4]" in p.stdout, p.stdout

        p = _run("whatif", "--zk", zk, "--bookie", "10.9.9.9:3181", ok=(2,))
        assert error_lines(p) == ["whatif: unknown bookie 10.9.9.9:3181"]

        # racks: b0 and b1 in /r1; b2, b3 have none and form the "unknown" rack
        doc = {"default": {b0: {"rack": "/r1"}, b1: {"rack": "r1", "hostname": "h"}}}
        c.store.meta.create("/bookies", json.dumps(doc).encode())
        p = _run("whatif", "--zk", zk, "--rack", "/r1", "--exit-code", ok=(1,))
        assert 'bookies with no rack count as one rack "unknown"' in p.stdout
        assert f"ledger {l1.ledger_id}  10 entries lost [0-9]" in p.stdout
        p = _run("whatif", "--zk", zk, "--rack", "/nowhere", ok=(2,))
        assert len(error_lines(p)) == 1 and "unknown rack /nowhere" in p.stderr
        c.store.meta.set("/bookies", b"{not json")
        p = _run("whatif", "--zk", zk, "--rack", "/r1", ok=(2,))
        (line,) = error_lines(p)
        assert "/bookies" in line and "JSON" in line
        p = _run("whatif", "--zk", zk, "--bookie", b3)  # --bookie stays rack-tolerant
        c.store.meta.delete("/bookies")

        # ---- lose b2, audit, whatif with findings -----------------------------------------
        c.sandbox.stop_bookie(b2)
        _run("audit", "--zk", zk, "--warehouse", wh, "--check", "replicas",
             "--executor", "local", "--read-timeout", "2", "--connect-timeout", "2")  # fmt: skip
        ledgers = {r["ledger_id"]: r for r in delta.read_rows(wh, LEDGERS)}
        assert (ledgers[l1.ledger_id]["topic"], ledgers[l1.ledger_id]["component"]) == (
            T1,
            "managed-ledger",
        )
        assert ledgers[l3.ledger_id]["topic"] is None
        frags = delta.read_rows(wh, FRAGMENTS)
        assert {f["topic"] for f in frags if f["ledger_id"] == l2.ledger_id} == {T2}
        p = _run("listunderreplicated", "--warehouse", wh, "--by-topic", ok=(1,))
        assert T2 in p.stdout and "(no topic)" in p.stdout

        # b3 was safe; with b2 gone, L2 keeps one replica only: unsafe.
        p = _run("whatif", "--zk", zk, "--bookie", b3, "--warehouse", wh, "--exit-code", ok=(1,))
        assert "already lost: " + b2 in p.stdout and T2 in p.stdout

        # ---- blast radius ---------------------------------------------------------------
        p = _run("blastradius", "--zk", zk, "--warehouse", wh, "--executor", "local")
        rows = {(r["scope"], r["name"]): r for r in delta.read_rows(wh, BLAST_RADIUS)}
        r0 = rows[("bookie", b0)]
        # L1 and L4 drop to one replica; L5 (AQ=1) and L6 (two left of four) keep AQ.
        assert (r0["ledgers_below_aq"], r0["entries_lost"]) == (2, 0) and r0["topics"] == [T1]
        # No racks any more: one "unknown" rack of every bookie; L3's only copy (on b2) was
        # already gone, so failing the rack loses the other five.
        assert rows[("rack", "unknown")]["ledgers_lost"] == 5
        r2 = rows[("bookie", b2)]  # lost already: nothing more to lose
        assert (r2["ledgers"], r2["ledgers_below_aq"], r2["ledgers_lost"]) == (3, 0, 0)

        # ---- triage: a repair run leaves L6 stuck (no bookie outside its ensemble) ---------
        _run("rereplicate", "--zk", zk, "--warehouse", wh, "--executor", "local",
             "--grace-period", "0s", ok=(0, 1))  # fmt: skip
        c.store.delete_ledger(l5.ledger_id)
        p = _run("triage", "--warehouse", wh, "--zk", zk, ok=(1,))
        got = {r["ledger_id"]: r for r in delta.read_rows(wh, TRIAGE)}
        assert got[l3.ledger_id]["class"] == "WRITE_QUORUM_ONE"
        assert got[l4.ledger_id]["class"] == "ENTRIES_LOST"
        assert got[l4.ledger_id]["lost_ranges"] == [{"first_entry_id": 3, "last_entry_id": 3}]
        assert got[l5.ledger_id]["class"] == "DELETED"
        assert got[l6.ledger_id]["class"] == "NO_REPLACEMENT", got[l6.ledger_id]
        assert got[l3.ledger_id]["age_seconds"] > 0

        out = tmp_path / "r.html"
        _run("report", "--warehouse", wh, "--out", str(out))
        page = out.read_text()
        for tid in ('id="blast-bookies"', 'id="blast-racks"', 'id="topics"', 'id="triage"'):
            assert tid in page
        assert "NO_REPLACEMENT" in page and T2 in page


def _message(x: int) -> bytes:
    """Entry ``x`` as a broker stores a message: CRC32C marker, metadata, payload."""
    import struct

    import crc32c

    from bklib.proto.pulsar_formats_pb2 import MessageMetadata

    meta = MessageMetadata(
        producer_name="p", sequence_id=x, publish_time=PUBLISHED + x * 1000
    ).SerializeToString()
    rest = struct.pack(">I", len(meta)) + meta + f"message {x}".encode()
    return b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(rest)) + rest


PUBLISHED = 1_790_000_000_000


def test_triage_names_lost_pulsar_messages_and_their_publish_times(
    tmp_path: Path, zk_chroot: str
) -> None:
    from datetime import datetime, timezone

    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=2) as c:
        b0, b1 = c.bookie_ids
        ml = "acme/orders/persistent/created"
        lid = c.store.generate_ledger_id()
        md = metadata(lid, [(0, [b0, b1])], wq=2, aq=2, last=7)
        md = md.replace(custom_metadata=_custom(ml), ctime=1_700_000_000_000, store_ctime=True)
        # Entries 3 and 4 are on no bookie; 2 and 5 survive around them.
        write_ledger(c.store, c.client, md, 8, skip=[(e, b) for e in (3, 4) for b in (b0, b1)],
                     payload=_message)  # fmt: skip
        # A cursor ledger with the same loss holds positions, not messages: no ids named.
        cursor = _custom(ml) | {"pulsar/cursor": b"sub"}
        clid = c.store.generate_ledger_id()
        cmd = metadata(clid, [(0, [b0, b1])], wq=2, aq=2, last=4)
        cmd = cmd.replace(custom_metadata=cursor, ctime=1_700_000_000_000, store_ctime=True)
        write_ledger(c.store, c.client, cmd, 5, skip=[(3, b0), (3, b1)])
        _run("audit", "--zk", c.zk, "--warehouse", wh, "--check", "replicas",
             "--executor", "local")  # fmt: skip
        p = _run("triage", "--warehouse", wh, "--zk", c.zk, ok=(1,))
        got = {r["ledger_id"]: r for r in delta.read_rows(wh, TRIAGE)}
        row = got[lid]
        assert row["class"] == "ENTRIES_LOST" and row["topic"] == T1
        assert row["lost_message_ids"] == f"{lid}:3..{lid}:4"
        after = datetime.fromtimestamp((PUBLISHED + 2000) / 1000, timezone.utc)
        before = datetime.fromtimestamp((PUBLISHED + 5000) / 1000, timezone.utc)
        assert (row["lost_published_after"], row["lost_published_before"]) == (after, before)
        assert f"lost messages {lid}:3..{lid}:4; published after {after.isoformat()}" in p.stdout
        assert got[clid]["class"] == "ENTRIES_LOST" and got[clid]["lost_message_ids"] is None
