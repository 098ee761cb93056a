"""Interop cell 4: ledger metadata (v3) written by Java parsed by bklib, and metadata created
and updated by bklib read by the Java client and printed by the Java shell."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from bklib.client.reader import LedgerReader
from bklib.meta import LedgerMetadata, Segment
from bklib.meta.model import DigestType, LedgerState
from bklib.testing.sandbox import BookieProcess
from tests.interop.conftest import ROOT, InteropCluster, _wait_znode
from tests.interop.harness import JavaClient, payloads

pytestmark = pytest.mark.interop

PWD = b"meta-pwd"
JAVA_DIGEST = {"CRC32": DigestType.CRC32, "MAC": DigestType.HMAC, "CRC32C": DigestType.CRC32C}


def assert_same(md: LedgerMetadata, java: dict[str, Any]) -> None:
    """bklib's view of a ledger equals the Java client's, field by field."""
    assert java["formatVersion"] == md.format_version == 3
    assert (java["ensembleSize"], java["writeQuorum"], java["ackQuorum"]) == (
        md.ensemble_size,
        md.write_quorum,
        md.ack_quorum,
    )
    assert java["state"] == md.state.name
    if md.state is LedgerState.CLOSED:
        assert (java["lastEntryId"], java["length"]) == (md.last_entry_id, md.length)
    assert JAVA_DIGEST[java["digestType"]] is md.digest_type
    assert base64.b64decode(java["password"]) == md.password
    assert java["ctime"] == md.ctime
    assert java["cToken"] == md.ctoken
    assert {int(k): tuple(v) for k, v in java["ensembles"].items()} == {
        s.first_entry_id: s.ensemble for s in md.segments
    }
    assert {k: base64.b64decode(v) for k, v in java["custom"].items()} == md.custom_metadata


def test_java_metadata_parsed_by_bklib(mixed: InteropCluster, java_client: JavaClient) -> None:
    """A Java ledger with custom metadata, HMAC digest and an ensemble change (a bookie of its
    first ensemble crashed mid-write): bklib decodes the same metadata and reads every entry."""
    temp = BookieProcess(mixed.connect, mixed.base / "py-temp")
    temp.spawn()
    try:
        _wait_znode(mixed.zk, f"{ROOT}/available/{temp.bookie_id}", temp.log_tail)
        first, second = payloads("meta-a", 20), payloads("meta-b", 20)
        custom = {"application": b"pulsar", "component": b"managed-ledger", "bin": b"\x00\xff"}
        lid = java_client.write(
            mixed.uri,
            first,
            password=PWD,
            digest="MAC",
            close=False,
            bookies=[mixed.java_ids[0], mixed.java_ids[1], temp.bookie_id],
            custom=custom,
        )
        temp.kill9()
        java_client.add(lid, second)  # forces an ensemble change at entry 20
        java_client.call("close", ledgerId=lid)
    finally:
        temp.stop()

    raw, _ = mixed.zk.get(mixed.store.path_for(lid))
    assert raw.startswith(b"BookieMetadataFormatVersion\t3\n")
    md = mixed.store.read_ledger(lid).value
    assert_same(md, java_client.metadata(mixed.uri, lid))
    assert md.custom_metadata == custom
    assert md.digest_type is DigestType.HMAC
    assert [s.first_entry_id for s in md.segments] == [0, 20]
    assert temp.bookie_id in md.segments[0].ensemble
    assert temp.bookie_id not in md.segments[1].ensemble
    assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, 39)

    async def read() -> list[bytes]:
        async with mixed.client() as ctx:
            r = await LedgerReader.open(ctx, lid, password=PWD)
            return [e.payload for e in await r.read_entries(0, 39)]

    assert asyncio.run(read()) == first + second


def test_bklib_metadata_read_by_java_and_shell(
    mixed: InteropCluster, java_client: JavaClient
) -> None:
    """Metadata created by bklib (two segments, custom metadata, HMAC), then updated by bklib
    (a bookie replaced in place, then closed): the Java client decodes exactly those fields
    after each write, and ``shell ledgermetadata`` prints the same LedgerMetadata."""
    store = mixed.store
    lid = store.generate_ledger_id()
    a, b, c, d, e = (f"10.0.0.{i}:3181" for i in range(1, 6))
    md = LedgerMetadata(
        ledger_id=lid,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        segments=(Segment(0, (a, b, c)), Segment(10, (a, b, d))),
        digest_type=DigestType.HMAC,
        password=PWD,
        ctime=1_732_000_000_123,
        store_ctime=True,
        custom_metadata={"owner": b"bkaudit", "blob": bytes(range(8))},
        ctoken=123456789,
    )
    created = store.create_ledger(md)
    assert_same(created.value, java_client.metadata(mixed.uri, lid))

    updated = store.update_ledger(lid, lambda m: m.with_bookies_replaced(0, {c: e}))
    updated = store.update_ledger(lid, lambda m: m.closed(19, 2000))
    final = updated.value
    assert final.segments == (Segment(0, (a, b, e)), Segment(10, (a, b, d)))
    java = java_client.metadata(mixed.uri, lid)
    assert_same(final, java)

    out = mixed.shell.run("ledgermetadata", "-ledgerid", str(lid)).stdout
    assert f"ledgerID: {lid}" in out, out
    assert java["text"] in out, out
    for part in (
        "formatVersion=3",
        "ensembleSize=3",
        "writeQuorumSize=2",
        "ackQuorumSize=2",
        "state=CLOSED",
        "length=2000",
        "lastEntryId=19",
        "digestType=MAC",
        f"password=base64:{base64.b64encode(PWD).decode()}",
        f"ensembles={{0=[{a}, {b}, {e}], 10=[{a}, {b}, {d}]}}",
        "owner=base64:" + base64.b64encode(b"bkaudit").decode(),
    ):
        assert part in out, (part, out)
