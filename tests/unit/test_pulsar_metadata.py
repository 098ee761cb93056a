"""Pulsar's managed-ledger, cursor and schema values, and the cross-check's rules (no I/O).

Values are built with our own .proto (bklib/proto/pulsar_formats.proto) and compressed the way
``MetaStoreImpl`` does; tests/pulsar reads the ones a real broker writes.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import pytest

from bklib.meta.pulsar import decode_pulsar_metadata
from bklib.proto.pulsar_formats_pb2 import (
    CompressionType,
    ManagedCursorInfo,
    ManagedInfoMetadata,
    ManagedLedgerInfo,
    SchemaLocator,
)
from bklib.pulsar.crosscheck import (
    BookKeeperLedger,
    confirm_dangling,
    confirm_orphan,
    dangling_candidates,
    orphan_candidates,
)
from bklib.pulsar.metadata import (
    CorruptPulsarMetadata,
    decode_cursor,
    decode_managed_ledger,
    decode_schema_ledgers,
)
from bklib.pulsar.references import Owner, PulsarReferences, Reference

KEY = "/managed-ledgers/public/default/persistent/t"


def _info(*ledgers: int, deleted: int | None = None) -> bytes:
    info = ManagedLedgerInfo()
    for lid in ledgers:
        li = info.ledgerInfo.add(ledgerId=lid, entries=10, size=1000, timestamp=1)
        if lid == deleted:
            li.offloadContext.complete = True
            li.offloadContext.bookkeeperDeleted = True
    return info.SerializeToString()


def _compressed(raw: bytes, codec: int) -> bytes:
    body = {
        CompressionType.NONE: lambda b: b,
        # Deflater with SYNC_FLUSH, never finished: no final block.
        CompressionType.ZLIB: lambda b: (lambda c: c.compress(b) + c.flush(zlib.Z_SYNC_FLUSH))(
            zlib.compressobj()
        ),
        CompressionType.LZ4: lambda b: bytes(cramjam.lz4.compress_block(b, store_size=False)),
        CompressionType.ZSTD: lambda b: bytes(cramjam.zstd.compress(b)),
        CompressionType.SNAPPY: lambda b: bytes(cramjam.snappy.compress_raw(b)),
    }[codec](raw)
    meta = ManagedInfoMetadata(compressionType=codec, uncompressedSize=len(raw))
    header = meta.SerializeToString()
    return b"\x47\x78" + struct.pack(">i", len(header)) + header + body


@pytest.mark.parametrize("codec", list(CompressionType.values()))
def test_managed_ledger_values_plain_and_compressed(codec: int) -> None:
    raw = _info(3, 7, 9, deleted=3)
    for data in (raw, _compressed(raw, codec)):
        ml = decode_managed_ledger(KEY, data)
        assert [e.ledger_id for e in ml.ledgers] == [3, 7, 9]
        assert [e.bookkeeper_deleted for e in ml.ledgers] == [True, False, False]
    assert decode_managed_ledger(KEY, b"").ledgers == ()  # a managed ledger just created


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xff\xff", "invalid ManagedLedgerInfo"),
        (b"\x47\x78\x00", "compression header truncated"),
        (b"\x47\x78\x00\x00\x00\x40", "out of range"),
        (_compressed(_info(1), CompressionType.ZSTD)[:-3], "ZSTD decompression failed"),
        (b"\x0a\x02\x10\x01", "lacks"),  # a LedgerInfo without its required ledgerId
    ],
)
def test_corrupt_values_name_their_key(data: bytes, reason: str) -> None:
    with pytest.raises(CorruptPulsarMetadata) as exc:
        decode_managed_ledger(KEY, data)
    assert str(exc.value).startswith(KEY) and reason in str(exc.value)


def test_cursor_and_schema_values() -> None:
    c = ManagedCursorInfo(cursorsLedgerId=-1, markDeleteLedgerId=5, markDeleteEntryId=2)
    c.properties.add(name="CompactedTopicLedger", value=42)
    got = decode_cursor(KEY + "/sub", _compressed(c.SerializeToString(), CompressionType.LZ4))
    assert (got.cursor_ledger, got.compacted_ledger, got.mark_delete) == (None, 42, (5, 2))
    assert decode_cursor(KEY + "/sub", ManagedCursorInfo(cursorsLedgerId=8).SerializeToString())
    loc = SchemaLocator()
    loc.info.version, loc.info.hash = 1, b"h"
    loc.info.position.ledgerId, loc.info.position.entryId = 12, 0
    e = loc.index.add(version=0, hash=b"g")
    e.position.ledgerId, e.position.entryId = 11, 0
    assert decode_schema_ledgers("/schemas/a/b/t", loc.SerializeToString()) == (11, 12)


ROOT = "/"


def _tags(**kw: str) -> dict[str, bytes]:
    return {k: v.encode() for k, v in {"application": "pulsar", **kw}.items()}


def _ledger(lid: int, ctime: int | None, **tags: str) -> BookKeeperLedger:
    return BookKeeperLedger(lid, ctime, 100, decode_pulsar_metadata(_tags(**tags)))


ML = "public/default/persistent/t"


def test_dangling_and_orphan_candidates() -> None:
    ml_key = f"/managed-ledgers/{ML}"
    refs = PulsarReferences(
        refs=[
            Reference(1, ml_key, Owner.MANAGED_LEDGER, "persistent://public/default/t"),
            Reference(2, ml_key, Owner.MANAGED_LEDGER, "persistent://public/default/t"),
            Reference(3, ml_key, Owner.MANAGED_LEDGER, None, bookkeeper_deleted=True),
            # The current ledger, closed empty and deleted before it was unlisted.
            Reference(12, ml_key, Owner.MANAGED_LEDGER, None, current=True),
        ],
        errors={"/managed-ledgers/public/default/persistent/broken": "invalid"},
    )
    day = 86_400_000
    now = 10 * day
    ledgers = {
        1: _ledger(1, 0, **{"pulsar/managed-ledger": ML, "component": "managed-ledger"}),
        # Unlisted, tagged for the same topic: old -> orphan; young -> not yet.
        4: _ledger(4, 0, **{"pulsar/managed-ledger": ML, "component": "managed-ledger"}),
        5: _ledger(5, now - 60_000, **{"pulsar/managed-ledger": ML}),
        # A cursor ledger its cursor no longer names; a schema ledger of a deleted schema.
        6: _ledger(6, 0, **{"pulsar/managed-ledger": ML, "pulsar/cursor": "sub"}),
        7: _ledger(7, 0, **{"pulsar/schemaId": "public/default/t", "component": "schema"}),
        # Its owner could not be decoded: unknown, never an orphan.
        8: _ledger(8, 0, **{"pulsar/managed-ledger": "public/default/persistent/broken"}),
        # Not Pulsar's; no creation time; another application.
        9: BookKeeperLedger(9, 0, 100, decode_pulsar_metadata({})),
        10: _ledger(10, None, **{"pulsar/managed-ledger": ML}),
        11: BookKeeperLedger(11, 0, 1, decode_pulsar_metadata({"application": b"function"})),
    }
    assert [r.ledger_id for r in dangling_candidates(refs, ledgers.__contains__)] == [2]
    orphans = orphan_candidates(refs, ledgers, root=ROOT, now_ms=now, min_age_ms=day)
    assert [(o.ledger.ledger_id, o.owner) for o in orphans] == [
        (4, Owner.MANAGED_LEDGER),
        (6, Owner.CURSOR),
        (7, Owner.SCHEMA),
    ]
    assert orphans[1].owner_key == f"/managed-ledgers/{ML}/sub"
    assert orphans[2].owner_key == "/schemas/public/default/t"
    # The re-read decides.
    ref = refs.refs[1]
    assert confirm_dangling(ref, frozenset({1, 2}), exists_now=False)
    assert not confirm_dangling(ref, None, exists_now=False)  # topic deleted meanwhile
    assert not confirm_dangling(ref, frozenset({1, 2}), exists_now=True)  # created since
    assert confirm_orphan(orphans[0], frozenset({1, 2}), owner_gone=False)
    assert not confirm_orphan(orphans[0], frozenset({1, 4}), owner_gone=False)  # listed now
    assert not confirm_orphan(orphans[0], None, owner_gone=False)  # undecodable now
    assert confirm_orphan(orphans[0], None, owner_gone=True)


def test_publish_time_with_and_without_the_optional_headers() -> None:
    from bklib.proto.pulsar_formats_pb2 import MessageMetadata
    from bklib.pulsar.messages import format_message_ids, publish_time

    meta = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1234).SerializeToString()
    plain = struct.pack(">I", len(meta)) + meta + b"payload"
    checked = b"\x0e\x01\x00\x00\x00\x00" + plain
    broker = b"\x0e\x02" + struct.pack(">I", 3) + b"\x08\x01\x10" + checked
    assert [publish_time(e) for e in (plain, checked, broker)] == [1234, 1234, 1234]
    for junk in (b"", b"\x0e\x02\x00", b"\x00\x00\x00\x09abc", b"\x00\x00\x00\x02\xff\xff"):
        assert publish_time(junk) is None
    assert format_message_ids(7, [(3, 3), (5, 9)]) == "7:3, 7:5..7:9"
    assert format_message_ids(7, [(i, i) for i in range(0, 50, 2)]).endswith("+5 more")


def test_references_in_is_the_one_rule_for_walk_and_re_read() -> None:
    from bklib.pulsar.references import references_in

    refs = references_in(KEY, Owner.MANAGED_LEDGER, _info(3, 7, 9), None)
    assert [(r.ledger_id, r.current) for r in refs] == [(3, False), (7, False), (9, False)]
    open_last = ManagedLedgerInfo()
    open_last.ledgerInfo.add(ledgerId=3, entries=10)
    open_last.ledgerInfo.add(ledgerId=4)  # being written: no entry count yet
    refs = references_in(KEY, Owner.MANAGED_LEDGER, open_last.SerializeToString(), None)
    assert [(r.ledger_id, r.current) for r in refs] == [(3, False), (4, True)]
    # The compacted ledger counts only while the cursor has no ledger of its own.
    c = ManagedCursorInfo(cursorsLedgerId=8)
    c.properties.add(name="CompactedTopicLedger", value=42)
    assert [r.ledger_id for r in references_in(KEY, Owner.CURSOR, c.SerializeToString(), None)] == [
        8
    ]
    c.cursorsLedgerId = -1
    (ref,) = references_in(KEY, Owner.CURSOR, c.SerializeToString(), None)
    assert (ref.ledger_id, ref.owner) == (42, Owner.COMPACTED)
