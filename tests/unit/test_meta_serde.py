"""Ledger metadata serde against the byte layouts of BookKeeper 4.17 (``LedgerMetadataSerDe``)."""

from __future__ import annotations

import random

import pytest

from bklib.errors import CompatibilityError, CorruptMetadataError
from bklib.meta import (
    DigestType,
    LedgerMetadata,
    LedgerState,
    Segment,
    decode_metadata,
    encode_metadata,
)
from bklib.proto.formats_pb2 import LedgerMetadataFormat

LID = 77
B1, B2, B3, B4 = "127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183", "127.0.0.1:3184"
H2 = b"BookieMetadataFormatVersion\t2\n"
H3 = b"BookieMetadataFormatVersion\t3\n"


def member(b: str) -> bytes:
    return bytes([0x0A, len(b)]) + b.encode()


# An open v3 ledger as LedgerMetadataSerDe writes it (E=3, WQ=2, AQ=2, CRC32C, empty password,
# cToken 0, no ctime), byte for byte.
V3_BODY = (
    bytes.fromhex("4f 08 02 10 03 18 00")
    + bytes.fromhex("20 ff ff ff ff ff ff ff ff ff 01")
    + bytes.fromhex("28 01 32 32")
    + member(B1)
    + member(B2)
    + member(B3)
    + bytes.fromhex("10 00 38 03 42 00 48 02 60 00")
)
METADATA_V3 = H3 + V3_BODY

METADATA_V2 = (
    H2
    + b"""quorumSize: 2
ensembleSize: 3
length: 0
lastEntryId: -1
state: OPEN
segment {
  ensembleMember: "127.0.0.1:3181"
  ensembleMember: "127.0.0.1:3182"
  ensembleMember: "127.0.0.1:3183"
  firstEntryId: 0
}
digestType: CRC32C
password: ""
ackQuorumSize: 2
"""
)

METADATA = LedgerMetadata(
    ledger_id=LID,
    ensemble_size=3,
    write_quorum=2,
    ack_quorum=2,
    segments=(Segment(0, (B1, B2, B3)),),
    digest_type=DigestType.CRC32C,
    password=b"",
)

# A CLOSED v3 ledger as protobuf-java lays it out: two segments, HMAC, ctime, custom metadata
# and a cToken, fields in field-number order.
CLOSED_V3_BODY = (
    bytes.fromhex("08 02 10 02 18 d2 09 20 09 28 03")
    + bytes.fromhex("32 22")
    + member(B1)
    + member(B2)
    + bytes.fromhex("10 00")
    + bytes.fromhex("32 22")
    + member(B3)
    + member(B2)
    + bytes.fromhex("10 05")
    + bytes.fromhex("38 02 42 02 70 77 48 01")
    + bytes.fromhex("50 80 d0 95 ff bc 31")  # ctime 1700000000000
    + bytes.fromhex("5a 09 0a 03 61 70 70 12 02 01 02")  # customMetadata app=\x01\x02
    + bytes.fromhex("60 2a")  # cToken 42
)
CLOSED_V3 = H3 + bytes([111]) + CLOSED_V3_BODY

CLOSED_MD = LedgerMetadata(
    ledger_id=LID,
    ensemble_size=2,
    write_quorum=2,
    ack_quorum=1,
    segments=(Segment(0, (B1, B2)), Segment(5, (B3, B2))),
    state=LedgerState.CLOSED,
    last_entry_id=9,
    length=1234,
    digest_type=DigestType.HMAC,
    password=b"pw",
    ctime=1_700_000_000_000,
    store_ctime=True,
    custom_metadata={"app": b"\x01\x02"},
    ctoken=42,
)


def v3(msg: LedgerMetadataFormat, trailer: bytes = b"") -> bytes:
    body = msg.SerializePartialToString()
    assert len(body) < 128
    return H3 + bytes([len(body)]) + body + trailer


def base_msg(**fields: object) -> LedgerMetadataFormat:
    msg = LedgerMetadataFormat(
        quorumSize=2, ensembleSize=3, length=0, lastEntryId=-1, state=LedgerState.OPEN
    )
    msg.segment.add(ensembleMember=[B1, B2, B3], firstEntryId=0)
    for k, v in fields.items():
        setattr(msg, k, v)
    return msg


def raises_corrupt(data: bytes, *words: str) -> CorruptMetadataError:
    with pytest.raises(CorruptMetadataError) as info:
        decode_metadata(data, LID)
    exc = info.value
    assert exc.ledger_id == LID
    assert f"ledger {LID}" in str(exc)
    for w in words:
        assert w in str(exc), str(exc)
    return exc


# ---- worked examples ----------------------------------------------------------------------------


def test_v3_metadata_encodes_byte_for_byte() -> None:
    assert encode_metadata(METADATA) == METADATA_V3


def test_v3_metadata_decodes() -> None:
    md = decode_metadata(METADATA_V3, LID)
    assert md == METADATA
    assert md.format_version == 3
    assert md.ctime is None and md.store_ctime is False


def test_last_entry_id_minus_one_is_a_ten_byte_varint() -> None:
    data = encode_metadata(METADATA)
    tag = data.index(b"\x20", len(H3) + 1)
    assert data[tag : tag + 11] == b"\x20" + b"\xff" * 9 + b"\x01"


def test_v2_text_metadata_parses_to_the_same_metadata() -> None:
    md = decode_metadata(METADATA_V2, LID)
    assert md == METADATA.replace(format_version=2)


def test_v2_encoding_matches_text_metadata_byte_for_byte() -> None:
    assert encode_metadata(METADATA.replace(format_version=2)) == METADATA_V2


def test_closed_v3_as_java_writes_it_round_trips_bytes() -> None:
    md = decode_metadata(CLOSED_V3, LID)
    assert md == CLOSED_MD
    assert encode_metadata(md) == CLOSED_V3


# ---- round trips --------------------------------------------------------------------------------

VARIANTS = [
    METADATA,
    CLOSED_MD,
    CLOSED_MD.replace(last_entry_id=-1, length=0, ctoken=0),  # empty closed ledger
    METADATA.replace(state=LedgerState.IN_RECOVERY, digest_type=DigestType.DUMMY),
    METADATA.replace(digest_type=DigestType.CRC32, password=b"\x00\xffsecret\n\t\"'\\"),
    METADATA.replace(
        segments=(
            Segment(0, (B1, B2, B3)),
            Segment(10, (B4, B2, B3)),
            Segment(11, (B4, B1, B3)),
        ),
        custom_metadata={"a": b"", "b\u00e9": b"\x00\x01\x7f\x80", "c": b"text"},
    ),
    METADATA.replace(ctime=1_732_000_000_000, store_ctime=True),
]


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("md", VARIANTS)
def test_round_trip(md: LedgerMetadata, version: int) -> None:
    md = md.replace(format_version=version)
    if version == 2:
        md = md.replace(ctoken=0)  # v2 has no cToken
    data = encode_metadata(md)
    assert data.startswith(b"BookieMetadataFormatVersion\t%d\n" % version)
    assert decode_metadata(data, LID) == md
    assert encode_metadata(decode_metadata(data, LID)) == data


def test_ctime_absent_comes_from_the_znode_and_is_not_written_back() -> None:
    md = decode_metadata(METADATA_V3, LID, znode_ctime_ms=1234)
    assert md.ctime == 1234 and md.store_ctime is False
    out = encode_metadata(md)
    assert out == METADATA_V3
    msg = LedgerMetadataFormat()
    msg.ParseFromString(out[len(H3) + 1 :])
    assert not msg.HasField("ctime")


def test_ctime_present_wins_over_the_znode_ctime() -> None:
    data = encode_metadata(METADATA.replace(ctime=99, store_ctime=True))
    md = decode_metadata(data, LID, znode_ctime_ms=1234)
    assert md.ctime == 99 and md.store_ctime is True


def test_v2_ledger_stays_v2_without_ctoken() -> None:
    text = METADATA_V2 + b"cToken: 12345\n"
    md = decode_metadata(text, LID)
    assert md.format_version == 2 and md.ctoken == 12345
    closed = md.closed(last_entry_id=3, length=40)
    out = encode_metadata(closed.replace(ctoken=777))
    assert out.startswith(H2)
    assert b"cToken" not in out
    assert b"state: CLOSED\n" in out and b"lastEntryId: 3\n" in out and b"length: 40\n" in out
    assert decode_metadata(out, LID) == closed


def test_new_ledgers_default_to_v3() -> None:
    assert METADATA.format_version == 3
    assert encode_metadata(METADATA.replace(ctoken=5)).startswith(H3)


def test_v3_writes_minus_one_and_zero_when_not_closed() -> None:
    for state in (LedgerState.OPEN, LedgerState.IN_RECOVERY):
        msg = LedgerMetadataFormat()
        msg.ParseFromString(encode_metadata(METADATA.replace(state=state))[len(H3) + 1 :])
        assert (msg.lastEntryId, msg.length, msg.state) == (-1, 0, state)
        assert msg.HasField("cToken") and msg.HasField("ackQuorumSize")


# ---- Java read semantics ------------------------------------------------------------------------


def test_ack_quorum_absent_defaults_to_write_quorum() -> None:
    msg = base_msg(digestType=3, password=b"")
    md = decode_metadata(v3(msg), LID)
    assert md.ack_quorum == 2 == md.write_quorum


def test_password_present_digest_absent_means_crc32() -> None:
    md = decode_metadata(v3(base_msg(password=b"x", ackQuorumSize=2)), LID)
    assert md.digest_type == DigestType.CRC32 and md.password == b"x"


def test_password_absent_means_no_digest_even_if_digest_is_stored() -> None:
    md = decode_metadata(v3(base_msg(digestType=2, ackQuorumSize=1)), LID)
    assert md.password is None and md.digest_type is None


def test_unclosed_ledger_ignores_stored_last_entry_and_length() -> None:
    for state in (LedgerState.OPEN, LedgerState.IN_RECOVERY):
        msg = base_msg(state=state, lastEntryId=55, length=999, password=b"", digestType=3)
        md = decode_metadata(v3(msg), LID)
        assert (md.state, md.last_entry_id, md.length) == (state, -1, 0)


def test_bytes_after_the_v3_message_and_unknown_fields_are_ignored() -> None:
    msg = base_msg(password=b"", digestType=3, ackQuorumSize=2)
    body = msg.SerializeToString() + bytes.fromhex("f8 06 07")  # field 111 varint 7
    data = H3 + bytes([len(body)]) + body + b"trailing junk"
    assert decode_metadata(data, LID) == METADATA.replace(ctoken=0)


def test_header_version_with_leading_zeros_and_sign() -> None:
    # Integer.parseInt of up to 9 characters read before the newline.
    for version in (b"003", b"+3", b"000000003"):
        data = b"BookieMetadataFormatVersion\t" + version + b"\n" + V3_BODY
        assert decode_metadata(data, LID) == METADATA


def test_overlong_length_prefix_is_accepted_like_protobuf_java() -> None:
    # readRawVarint32 keeps the low 32 bits of a varint up to 10 bytes long.
    data = H3 + bytes([0x4F | 0x80, 0x80, 0x80, 0x80, 0x00]) + V3_BODY[1:]
    assert decode_metadata(data, LID) == METADATA


def test_v2_text_with_escapes_comments_any_order_and_colon_brace() -> None:
    text = H2 + (
        b"# written by hand\n"
        b'password: "a\\t\\n\\r\\"\\\'\\\\\\001\\377\\x41"  # trailing comment\n'
        b"segment: {\n"
        b"  firstEntryId: 0\n"
        b'  ensembleMember: "127.0.0.1:3181" ensembleMember: "127.0.0.1:3182"\n'
        b'  ensembleMember: "127.0.0.1:3183"\n'
        b"}\n"
        b"segment <firstEntryId: 7 ensembleMember: '127.0.0.1:3184' "
        b'ensembleMember: "127.0.0.1:3182" ensembleMember: "127.0.0.1:3183">\n'
        b"state: CLOSED lastEntryId: 20 length: 300\n"
        b"ackQuorumSize: 1 ensembleSize: 3 quorumSize: 2\n"
        b"digestType: HMAC\n"
        b'customMetadata { key: "k" value: "\\000v" }\n'
    )
    md = decode_metadata(text, LID)
    assert md.password == b"a\t\n\r\"'\\\x01\xffA"
    assert md.segments == (Segment(0, (B1, B2, B3)), Segment(7, (B4, B2, B3)))
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 20, 300)
    assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (3, 2, 1)
    assert md.digest_type == DigestType.HMAC
    assert md.custom_metadata == {"k": b"\x00v"}
    assert md.format_version == 2


def test_v2_enum_numbers_and_repeated_singular_fields_like_textformat_merge() -> None:
    text = METADATA_V2 + b"state: 3\nlastEntryId: 4\nquorumSize: 3\ndigestType: 4\n"
    md = decode_metadata(text, LID)
    assert md.state == LedgerState.CLOSED and md.last_entry_id == 4
    assert md.write_quorum == 3 and md.digest_type == DigestType.DUMMY


def test_v2_non_ascii_password_and_member_escape_as_octal() -> None:
    md = METADATA.replace(format_version=2, password=b"\xe9\x00", custom_metadata={"\u00e9": b""})
    out = encode_metadata(md)
    assert b'password: "\\351\\000"' in out
    assert b'key: "\\303\\251"' in out
    out.decode("ascii")
    assert decode_metadata(out, LID) == md


# ---- v1 legacy ----------------------------------------------------------------------------------

H1 = b"BookieMetadataFormatVersion\t1\n"


def test_v1_open() -> None:
    data = H1 + b"2\n3\n0\n0\t%s\t%s\t%s\n" % (B1.encode(), B2.encode(), B3.encode())
    md = decode_metadata(data, LID, znode_ctime_ms=5)
    assert md == LedgerMetadata(
        ledger_id=LID,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        segments=(Segment(0, (B1, B2, B3)),),
        digest_type=None,
        password=None,
        ctime=5,
        format_version=1,
    )


def test_v1_closed_with_two_segments() -> None:
    data = H1 + (
        b"2\n2\n4096\n0\t127.0.0.1:3181\t127.0.0.1:3182\n"
        b"6\t127.0.0.1:3183\t127.0.0.1:3182\n41\tCLOSED"
    )
    md = decode_metadata(data, LID)
    assert md.state == LedgerState.CLOSED
    assert (md.last_entry_id, md.length) == (41, 4096)
    assert md.segments == (Segment(0, (B1, B2)), Segment(6, (B3, B2)))
    assert md.ack_quorum == 2 and md.password is None and md.digest_type is None


def test_v1_in_recovery() -> None:
    data = H1 + b"1\n1\n77\n0\t127.0.0.1:3181\n-102\tCLOSED"
    md = decode_metadata(data, LID)
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.IN_RECOVERY, -1, 0)


def test_v1_stops_at_the_closed_line_and_accepts_crlf() -> None:
    data = H1 + b"1\r\n1\r\n0\r\n0\t127.0.0.1:3181\r\n-1\tCLOSED\nnot parsed at all"
    md = decode_metadata(data, LID)
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, -1, 0)


def test_v1_is_written_back_as_v1_and_passwordless_v3_is_refused() -> None:
    # Byte-for-byte agreement with BookKeeper's serializer: tests/unit/test_meta_v1_golden.py.
    data = H1 + b"1\n1\n0\n0\t127.0.0.1:3181\n"
    md = decode_metadata(data, LID)
    assert encode_metadata(md) == data
    with pytest.raises(CompatibilityError, match="password") as info:
        encode_metadata(md.replace(password=b"x", digest_type=DigestType.CRC32))
    assert info.value.ledger_id == LID
    with pytest.raises(CorruptMetadataError, match="password"):
        encode_metadata(md.replace(format_version=3))


@pytest.mark.parametrize(
    "body",
    [b"", b"2\n3\n", b"x\n1\n0\n", b"1\n1\n0\n0\n", b"1\n1\n0\nz\t127.0.0.1:3181\n"],
)
def test_v1_corrupt(body: bytes) -> None:
    raises_corrupt(H1 + body)


# ---- corruption ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "word"),
    [
        (b"", "header"),
        (b"BookieMetadataFormatVersion 3\n", "header"),
        (b"bookieMetadataFormatVersion\t3\n" + V3_BODY, "header"),
        (b"BookieMetadataFormatVersion\t", "version"),
        (b"BookieMetadataFormatVersion\t12345678901\n", "version"),
        (b"BookieMetadataFormatVersion\t0000000003\n" + V3_BODY, "end of the"),
        (b"BookieMetadataFormatVersion\tx\n", "version"),
        (b"BookieMetadataFormatVersion\t4\n" + V3_BODY, "version 4"),
        (b"BookieMetadataFormatVersion\t0\n", "version 0"),
    ],
)
def test_bad_header(data: bytes, word: str) -> None:
    raises_corrupt(data, word)


@pytest.mark.parametrize(
    "data",
    [
        H3,  # no length prefix
        H3 + b"\x80",  # incomplete varint
        H3 + b"\xff" * 11,  # varint too long
        METADATA_V3[:-5],  # message shorter than its prefix
        H3 + b"\x04\x08\x02\x10",  # prefix covers a truncated field
        H3 + b"\xff\xff\xff\xff\x0f",  # negative int32 length
    ],
)
def test_truncated_or_malformed_v3(data: bytes) -> None:
    raises_corrupt(data, "v3")


@pytest.mark.parametrize(
    "text",
    [
        b"hello world\n",
        b"quorumSize: two\n",
        b"unknownField: 1\n",
        b"state: SLEEPING\n",
        b'password: "unterminated\n',
        b"segment {\n firstEntryId: 0\n",
        b"\xff\xfe garbage",
    ],
)
def test_garbage_v2_text(text: bytes) -> None:
    raises_corrupt(H2 + text, "v2")


@pytest.mark.parametrize("drop", ["quorumSize", "ensembleSize", "length", "state"])
def test_missing_required_field_v3(drop: str) -> None:
    msg = base_msg(password=b"", digestType=3)
    msg.ClearField(drop)
    raises_corrupt(v3(msg), "required", drop)


def test_missing_first_entry_id_in_segment() -> None:
    raises_corrupt(
        METADATA_V2.replace(b"  firstEntryId: 0\n", b""), "required", "segment[0].firstEntryId"
    )


def test_unknown_state_number_in_binary_counts_as_missing() -> None:
    msg = base_msg(password=b"", digestType=3)
    body = msg.SerializeToString().replace(b"\x28\x01", b"\x28\x09")
    raises_corrupt(H3 + bytes([len(body)]) + body, "state")


@pytest.mark.parametrize(
    ("fields", "word"),
    [
        ({"ensembleSize": 1}, "ensemble"),  # E < WQ
        ({"ackQuorumSize": 3}, "ack"),  # AQ > WQ
        ({"ensembleSize": 4, "quorumSize": 2}, "has 3 bookies"),  # wrong member count
    ],
)
def test_invalid_quorums(fields: dict[str, int], word: str) -> None:
    raises_corrupt(v3(base_msg(password=b"", digestType=3, **fields)), word)


def test_segments_out_of_order() -> None:
    msg = base_msg(password=b"", digestType=3)
    msg.segment[0].firstEntryId = 10
    msg.segment.add(ensembleMember=[B1, B2, B3], firstEntryId=10)
    raises_corrupt(v3(msg), "strictly increasing")


@pytest.mark.parametrize("first", [-1, -(2**63)])
def test_negative_first_segment_key(first: int) -> None:
    msg = base_msg(password=b"", digestType=3)
    msg.segment[0].firstEntryId = first
    raises_corrupt(v3(msg), "negative entry id", str(first))
    text = METADATA_V2.replace(b"firstEntryId: 0", f"firstEntryId: {first}".encode())
    raises_corrupt(text, "negative entry id")
    raises_corrupt(H1 + f"2\n3\n0\n{first}\t{B1}\t{B2}\t{B3}\n".encode(), "negative entry id")


def test_closed_ledger_of_2_63_entries() -> None:
    md = decode_metadata(v3(base_msg(password=b"", state=3, lastEntryId=2**63 - 2)), LID)
    assert md.last_entry_id == 2**63 - 2
    raises_corrupt(v3(base_msg(password=b"", state=3, lastEntryId=2**63 - 1)), "fit a long")


@pytest.mark.parametrize("bad", ["bad bookie:3181", "readonly", "host/3181", ""])
def test_invalid_bookie_id(bad: str) -> None:
    msg = base_msg(password=b"", digestType=3)
    msg.segment[0].ensembleMember[1] = bad
    raises_corrupt(v3(msg), "invalid bookie id")


def test_duplicate_custom_metadata_key() -> None:
    msg = base_msg(password=b"", digestType=3)
    msg.customMetadata.add(key="k", value=b"1")
    msg.customMetadata.add(key="k", value=b"2")
    raises_corrupt(v3(msg), "duplicate", "'k'")
    text = METADATA_V2 + b'customMetadata { key: "k" }\ncustomMetadata { key: "k" }\n'
    raises_corrupt(text, "duplicate")


def test_no_segments() -> None:
    msg = base_msg(password=b"", digestType=3)
    del msg.segment[:]
    raises_corrupt(v3(msg), "no ensembles")


def test_encode_validates_first() -> None:
    with pytest.raises(CorruptMetadataError) as info:
        encode_metadata(METADATA.replace(ensemble_size=4))
    assert info.value.ledger_id == LID
    with pytest.raises(CorruptMetadataError, match="out of range"):
        encode_metadata(METADATA.replace(ctoken=2**63))
    with pytest.raises(CorruptMetadataError, match="ctime"):
        encode_metadata(METADATA.replace(store_ctime=True, ctime=None))


def test_non_utf8_strings_decode_with_replacement_like_java() -> None:
    msg = base_msg(password=b"", digestType=3, ackQuorumSize=2)
    msg.segment[0].ensembleMember[0] = "X"
    body = msg.SerializeToString().replace(b"\x0a\x01X", b"\x0a\x01\xff")
    raises_corrupt(H3 + bytes([len(body)]) + body, "invalid bookie id", "\ufffd")
    ok = base_msg(password=b"", digestType=3, ackQuorumSize=2)
    ok.customMetadata.add(key="X", value=b"v")
    body = ok.SerializeToString().replace(b"\x0a\x01X", b"\x0a\x01\xff")
    md = decode_metadata(H3 + bytes([len(body)]) + body, LID)
    assert md.custom_metadata == {"\ufffd": b"v"}


def test_mutated_input_only_ever_raises_corrupt_metadata() -> None:
    rng = random.Random(20)
    seeds = [
        METADATA_V3,
        CLOSED_V3,
        METADATA_V2,
        H1 + b"2\n2\n9\n0\t127.0.0.1:3181\t127.0.0.1:3182\n3\tCLOSED",
    ]
    outcomes = {"ok": 0, "corrupt": 0}
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(data))
            if rng.random() < 0.6:
                data[pos] = rng.randrange(256)
            else:
                del data[pos]
        try:
            decode_metadata(bytes(data), LID)
            outcomes["ok"] += 1
        except CorruptMetadataError as exc:
            assert exc.ledger_id == LID
            outcomes["corrupt"] += 1
    assert outcomes["ok"] > 0 and outcomes["corrupt"] > 0


def test_decoded_ledgers_share_their_bookie_ids_and_password() -> None:
    """A scan holds a million decoded ensembles: equal bookie ids (and passwords) are one
    object each, not a string per member per ledger."""
    a = decode_metadata(H3 + V3_BODY, LID)
    b = decode_metadata(H3 + V3_BODY, LID + 1)
    assert a.segments[0].ensemble == (B1, B2, B3)
    for x, y in zip(a.segments[0].ensemble, b.segments[0].ensemble, strict=True):
        assert x is y
    assert a.password is not None and a.password is b.password


def test_the_shared_ids_table_starts_over_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster naming ever new bookie ids (or garbage) cannot grow the table without bound;
    what was decoded before it started over keeps its values."""
    from bklib.meta import serde

    monkeypatch.setattr(serde, "_SHARED_MAX", 4)
    monkeypatch.setattr(serde, "_BOOKIE_IDS", {})
    kept = decode_metadata(H3 + V3_BODY, LID)
    for i in range(10):
        md = LedgerMetadata(
            ledger_id=LID,
            ensemble_size=3,
            write_quorum=2,
            ack_quorum=2,
            segments=[Segment(0, (f"10.0.0.{i}:3181", B2, B3))],
            state=LedgerState.OPEN,
            digest_type=DigestType.CRC32C,
            password=b"",
        )
        again = decode_metadata(encode_metadata(md), LID)
        assert again.segments[0].ensemble[0] == f"10.0.0.{i}:3181"
        assert len(serde._BOOKIE_IDS) <= 4 + 3
    assert kept.segments[0].ensemble == (B1, B2, B3)
