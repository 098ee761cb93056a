"""bklib.proto.v2: v2 ("PreV3") requests byte for byte as Java's ``RequestEnDeCoderPreV3`` and
``DigestManager`` write them, replies round-tripped between the bookie's encoders and the
client's decoder, and malformed replies refused."""

from __future__ import annotations

import struct

import pytest

from bklib.proto import v2
from bklib.proto.framing import FramingError
from tests.bookie_helpers import KEY, entry_body


def test_packet_header_matches_java_packet_header() -> None:
    # PacketHeader.toInt(2, ADDENTRY, FLAG_RECOVERY_ADD | FLAG_HIGH_PRIORITY)
    assert v2.packet_header(2, 1, 0x6) == 0x02010006
    assert v2.parse_header(0x02010006) == (2, 1, 6)
    # Version 0: the int is the opcode, flags are dropped.
    assert v2.packet_header(0, 2, 0x1) == 2
    assert v2.parse_header(2) == (0, 2, 0)
    # A version byte >= 0x80 stays a signed 32-bit int, as Java's int is.
    assert v2.packet_header(0x80, 7) == struct.unpack(">i", bytes([0x80, 7, 0, 0]))[0]
    assert v2.parse_header(v2.packet_header(0x80, 7, 1)) == (0x80, 7, 1)


def test_read_request_layout() -> None:
    assert v2.encode_read(5, 9) == struct.pack(">Iiqq", 20, 0x02020000, 5, 9)
    fenced = v2.encode_read(5, -1, fence=True, master_key=KEY, high_priority=True)
    assert fenced == struct.pack(">Iiqq", 40, 0x02020005, 5, -1) + KEY
    with pytest.raises(ValueError, match="20 bytes"):
        v2.encode_read(5, 0, fence=True)
    with pytest.raises(ValueError, match="20 bytes, got 3"):
        v2.encode_read(5, 0, fence=True, master_key=b"abc")


def test_batch_read_request_layout() -> None:
    # header, ledgerId, startEntryId, requestId, maxCount (int), maxSize (long)
    frame = v2.encode_batch_read(7, 100, 42, 50, 1 << 20)
    assert frame == struct.pack(">Iiqqqiq", 40, 0x02070000, 7, 100, 42, 50, 1 << 20)
    fenced = v2.encode_batch_read(7, 0, 1, 0, 0, fence=True, master_key=KEY)
    assert fenced == struct.pack(">Iiqqqiq", 60, 0x02070001, 7, 0, 1, 0, 0) + KEY


def test_add_request_layout_is_digest_managers() -> None:
    body = entry_body(3, 4, b"payload")
    frame = v2.encode_add(3, 4, KEY, body, recovery=True)
    # computeDigestAndPackageForSendingV2: length, header, master key, then the stored entry.
    assert frame == struct.pack(">Ii", 4 + 20 + len(body), 0x02010002) + KEY + body
    with pytest.raises(ValueError, match="ledger 3, entry 5"):
        v2.encode_add(3, 5, KEY, body)
    with pytest.raises(ValueError, match="ledger 3, entry 4"):
        v2.encode_add(3, 4, KEY, b"short")
    with pytest.raises(ValueError, match="master key"):
        v2.encode_add(3, 4, KEY[:19], body)


def _unframe(framed: bytes) -> bytes:
    (n,) = struct.unpack_from(">I", framed)
    assert n == len(framed) - 4
    return framed[4:]


def test_add_and_read_replies_round_trip() -> None:
    add = v2.decode_response(_unframe(v2.encode_add_response(2, 104, 8, 3)))
    assert add == v2.Response(2, v2.ADD_ENTRY, 104, 8, 3)
    body = entry_body(8, 3, b"x" * 100)
    read = v2.decode_response(_unframe(v2.encode_read_response(2, 0, 8, 3, body)))
    assert read == v2.Response(2, v2.READ_ENTRY, 0, 8, 3, body)
    missing = v2.decode_response(_unframe(v2.encode_read_response(2, 2, 8, -1)))
    assert missing == v2.Response(2, v2.READ_ENTRY, 2, 8, -1, b"")


def test_batch_read_reply_round_trips() -> None:
    bodies = [entry_body(8, e, b"y" * e) for e in range(5)]
    framed = v2.encode_batch_read_response(2, 0, 8, 0, 77, bodies)
    resp = v2.decode_response(_unframe(framed))
    assert isinstance(resp, v2.BatchReadResponse)
    assert (resp.rc, resp.ledger_id, resp.start_entry_id, resp.request_id) == (0, 8, 0, 77)
    assert resp.entries == bodies
    assert resp.total_size == len(framed) == 36 + sum(4 + len(b) for b in bodies)
    empty = v2.decode_response(_unframe(v2.encode_batch_read_response(2, 2, 8, 9, 78)))
    assert isinstance(empty, v2.BatchReadResponse)
    assert (empty.rc, empty.entries, empty.total_size) == (2, [], 36)
    # Zero-length entries are legal framing (the client rejects them as entries later).
    odd = v2.decode_response(_unframe(v2.encode_batch_read_response(2, 0, 8, 0, 1, [b"", b"z"])))
    assert isinstance(odd, v2.BatchReadResponse) and odd.entries == [b"", b"z"]


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "no header"),
        (b"\x02\x01", "no header"),
        (struct.pack(">iiq", 0x02010000, 0, 1), "truncated v2 ADD_ENTRY"),
        (struct.pack(">iiqqB", 0x02010000, 0, 1, 2, 0), "ADD_ENTRY reply of 25 bytes"),
        (struct.pack(">iiq", 0x02020000, 0, 1), "truncated v2 READ_ENTRY"),
        (struct.pack(">iiqq", 0x02070000, 0, 1, 2), "truncated v2 BATCH_READ_ENTRY"),
        (struct.pack(">iiqqqI", 0x02070000, 0, 1, 0, 3, 10) + b"short", "announces 10 bytes"),
        (struct.pack(">iiqqqI", 0x02070000, 0, 1, 0, 3, 1) + b"a\x00\x00", "ends with 2 bytes"),
        (struct.pack(">iiqqqi", 0x02070000, 0, 1, 0, 3, -1), "announces 4294967295 bytes"),
        (struct.pack(">i", 0x02030000) + b"auth", "unexpected v2 reply opcode 3"),
        (struct.pack(">iiqq", 0x02050000, 0, 1, 2), "opcode 5"),
        (b"\x0a\x05garbage-protobuf", "opcode"),
    ],
)
def test_malformed_replies_are_refused(frame: bytes, reason: str) -> None:
    with pytest.raises(v2.MalformedV2Frame, match=reason) as ei:
        v2.decode_response(frame)
    assert isinstance(ei.value, FramingError)
