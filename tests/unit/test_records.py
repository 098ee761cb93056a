"""The scan's records built without ``__init__`` (bklib/records.py) are the records ``__init__``
builds: every field named, each in its normal form, equal, hashable, picklable and frozen."""

from __future__ import annotations

import dataclasses
import pickle
import struct
from typing import Any

import pytest

from bklib.audit.model import LedgerView, segment_spans
from bklib.client.connection import BookieConnection
from bklib.client.connection_v2 import BookieConnectionV2
from bklib.digest import EntryView, digest_manager
from bklib.errors import CorruptMetadataError
from bklib.meta import paths
from bklib.meta.model import DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.scan import ScanResult, _to_result
from bklib.meta.serde import (
    HEADER_PREFIX,
    _read_varint32,
    _to_proto,
    _varint,
    decode_metadata,
    encode_metadata,
)
from bklib.meta.stores.base import ValueRead
from bklib.meta.stores.zookeeper.bulk import _STAT, GetResult, _get_data_at
from bklib.meta.stores.zookeeper.store import _value_read
from bklib.proto import protocol_pb2 as pb
from bklib.proto import v2
from bklib.records import frozen_record

B = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")


def field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _types(obj: Any) -> dict[str, type]:
    """Each field's type: an IntEnum stored as a plain int compares equal, but is not normal."""
    return {k: type(v) for k, v in vars(obj).items()}


def _as_init_builds_it(obj: Any) -> None:
    """``obj`` names every field of its class, and equals what ``__init__`` builds of the same
    values (``__post_init__`` included: it would have normalised what was not normal)."""
    cls = type(obj)
    assert set(vars(obj)) == field_names(cls), cls.__name__
    again = cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)})
    assert again == obj
    assert vars(again) == vars(obj) and _types(again) == _types(obj)
    if cls not in (LedgerMetadata, ScanResult):  # these hold a dict: unhashable
        assert hash(again) == hash(obj)
    assert pickle.loads(pickle.dumps(obj)) == obj
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, dataclasses.fields(cls)[0].name, None)


def _metadata(closed: bool, segments: int, **extra: Any) -> LedgerMetadata:
    segs = tuple(Segment(100 * k, B[k % 3 :] + B[: k % 3]) for k in range(segments))
    return LedgerMetadata(
        ledger_id=4242, ensemble_size=3, write_quorum=2, ack_quorum=2, segments=segs,
        state=LedgerState.CLOSED if closed else LedgerState.OPEN,
        last_entry_id=150 if closed else -1, length=9000 if closed else 0,
        custom_metadata={"component": b"managed-ledger",
                         "pulsar/managed-ledger": b"t/ns/persistent/topic-1"},
        **extra,
    )  # fmt: skip


CASES = [
    _metadata(True, 1),
    _metadata(True, 3),
    _metadata(False, 2),
    _metadata(True, 2, digest_type=DigestType.HMAC, password=b"pw", ctime=1_700_000_000_000,
              store_ctime=True),
]  # fmt: skip


@pytest.mark.parametrize("md", CASES, ids=range(len(CASES)))
def test_the_decoder_builds_metadata_and_views_as_init_does(md: LedgerMetadata) -> None:
    got = decode_metadata(encode_metadata(md), md.ledger_id, znode_ctime_ms=5)
    _as_init_builds_it(got)
    assert type(got.state) is LedgerState and type(got.segments) is tuple
    assert all(type(s) is Segment and type(s.ensemble) is tuple for s in got.segments)
    assert got.segments == md.segments and got.custom_metadata == md.custom_metadata
    view = LedgerView.from_metadata(got, "/ledgers/00/0000/L4242", 7)
    assert LedgerView.from_row(view.as_row()) == view


def test_a_v3_ledger_without_password_is_built_as_init_does() -> None:
    msg = _to_proto(_metadata(False, 1), with_ctoken=True)
    msg.ClearField("password")
    raw = msg.SerializeToString()
    got = decode_metadata(HEADER_PREFIX + b"3\n" + _varint(len(raw)) + raw, 9, znode_ctime_ms=5)
    assert got.password is None and got.digest_type is None
    _as_init_builds_it(got)
    view = LedgerView.from_metadata(got)
    assert view.password is None and view.digest_type is None


@pytest.mark.parametrize(
    ("closed", "segments", "last", "ends", "spans"),
    [
        (True, 1, 150, [150], [150]),
        (True, 3, 150, [99, 150, 150], [99, 150, 150]),
        (True, 3, 120, [99, 120, 120], [99, 120, 120]),  # a middle segment past the last entry
        (True, 2, 40, [40, 40], [40, 40]),
        (True, 2, -1, [-1, -1], [-1, -1]),  # closed empty
        (False, 2, -1, [99, -1], [99, None]),  # the open last segment's end is unknown
        (False, 1, -1, [-1], [None]),
    ],
)
def test_segment_ends_and_spans(
    closed: bool, segments: int, last: int, ends: list[int], spans: list[int | None]
) -> None:
    md = _metadata(closed, segments).replace(last_entry_id=last, length=1 if closed else 0)
    assert md.segment_ends() == ends
    assert [md.segment_last_entry_id(i) for i in range(segments)] == ends
    if not closed:
        assert md.segment_ends(lac=77)[-1] == 77 == md.segment_last_entry_id(segments - 1, 77)
    got = segment_spans(md)
    assert [s.last_entry_id for s in got] == spans
    assert [(s.first_entry_id, s.ensemble) for s in got] == [
        (s.first_entry_id, s.ensemble) for s in md.segments
    ]


def test_no_segments_no_ends() -> None:
    md = _metadata(True, 1)
    bare = dataclasses.replace(md, segments=())
    assert bare.segment_ends() == [] and segment_spans(bare) == ()


def test_the_bulk_reader_and_the_store_build_their_reads_as_init_does() -> None:
    # czxid, mzxid, ctime, mtime, version, cversion, aversion, owner, length, children, pzxid
    stat = struct.pack(">qqqqiiiqiiq", 1, 2, 3, 4, 5, 6, 7, 0x1234, 9, 10, 11)
    frame = struct.pack(">i", 3) + b"abc" + stat
    got, off = _get_data_at("/ledgers/L1", frame, 0)
    assert off == len(frame) == 7 + _STAT.size
    _as_init_builds_it(got)
    _as_init_builds_it(got.stat)
    assert (got.path, got.data, got.err) == ("/ledgers/L1", b"abc", 0)
    assert vars(got.stat) == {
        "ctime": 3, "mtime": 4, "version": 5, "cversion": 6, "ephemeral_owner": 0x1234,
        "num_children": 10,
    }  # fmt: skip
    read = _value_read(got)
    _as_init_builds_it(read)
    assert (read.path, read.data, read.error) == ("/ledgers/L1", b"abc", None)
    assert read.stat is not None
    _as_init_builds_it(read.stat)
    assert vars(read.stat) == {
        "version": 5, "ctime_ms": 3, "mtime_ms": 4, "ephemeral_owner": "0x1234",
        "num_children": 10, "child_version": 6,
    }  # fmt: skip
    persistent, _ = _get_data_at(
        "/p", struct.pack(">i", 0) + struct.pack(">qqqqiiiqiiq", *[0] * 11), 0
    )
    assert _value_read(persistent).stat.ephemeral_owner is None  # type: ignore[union-attr]


def test_a_scan_result_is_built_as_init_does() -> None:
    md = _metadata(True, 2)
    data = encode_metadata(md)
    frame = struct.pack(">i", len(data)) + data + struct.pack(">qqqqiiiqiiq", *range(11))
    got, _ = _get_data_at(paths.ledger_path("/ledgers", 4242), frame, 0)
    result = _to_result(4242, _value_read(got))
    assert isinstance(result, ScanResult)
    _as_init_builds_it(result)
    assert (result.ledger_id, result.path, result.error) == (4242, got.path, None)
    assert result.metadata == md.replace(ctime=2) and result.version == 4  # ctime: the znode's


@pytest.mark.parametrize("lac", [None, 41])
def test_a_read_result_is_built_as_init_does(lac: int | None) -> None:
    # v3: maxLAC when the bookie sent one; v2 never carries it.
    sub = pb.ReadResponse(status=pb.EOK, ledgerId=7, entryId=3, body=b"entry")
    if lac is not None:
        sub.maxLAC = lac
    conn = BookieConnection("b:1", ("127.0.0.1", 1))
    got = conn._read_result(sub, 7, 3)
    _as_init_builds_it(got)
    assert (got.body, got.max_lac) == (b"entry", lac)
    v2_got = BookieConnectionV2("b:1", ("127.0.0.1", 1))._read_result(
        v2.Response(2, v2.READ_ENTRY, 0, 7, 3, b"entry"), 7, 3
    )
    _as_init_builds_it(v2_got)
    assert (v2_got.body, v2_got.max_lac) == (b"entry", None)


def test_a_verified_entry_is_built_as_init_does() -> None:
    dm = digest_manager(7, DigestType.CRC32C, b"pw")
    got = dm.verify_entry(dm.package_entry(3, 2, 15, b"payload"), 3)
    assert set(vars(got)) == field_names(EntryView)
    again = EntryView(**vars(got))
    assert again == got and _types(again) == _types(got)
    assert (got.ledger_id, got.entry_id, got.lac, got.length, bytes(got.payload)) == (
        7,
        3,
        2,
        15,
        b"payload",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.lac = 0  # type: ignore[misc]


def test_frozen_record_takes_the_values_as_they_are() -> None:
    got = frozen_record(GetResult, {"path": "/p", "data": None, "stat": None, "err": -101})
    assert got == GetResult("/p", None, None, -101) and got.error_name == "NONODE"
    read = frozen_record(ValueRead, {"path": "/p", "data": None, "stat": None, "error": None})
    assert read.missing


def _loop_varint32(data: bytes, pos: int) -> tuple[int, int] | str:
    """protobuf-java's readRawVarint32 from a stream, as the loop reads it: the reference."""
    value = 0
    for i in range(10):
        if pos + i >= len(data):
            return "truncated"
        b = data[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            value &= 0xFFFFFFFF
            return "negative" if value >= 2**31 else (value, pos + i + 1)
    return "malformed"


def _encode(value: int) -> bytes:
    raw = bytearray()
    v = value & 0xFFFFFFFFFFFFFFFF  # a negative int32 is written sign-extended, in 10 bytes
    while True:
        byte, v = v & 0x7F, v >> 7
        raw.append(byte | (0x80 if v else 0))
        if not v:
            return bytes(raw)


INPUTS = [
    _encode(v) + tail
    for v in (0, 1, 127, 128, 300, 16383, 16384, 2**21, 2**31 - 1, 2**31, -1, -5)
    for tail in (b"", b"b", b"body")
] + [b"", b"\x05", b"\x80", b"\x80\x80", b"\xff" * 11, b"\x80\x00", b"\xff\x7f"]


@pytest.mark.parametrize("tail", INPUTS, ids=range(len(INPUTS)))
def test_the_length_prefix_reads_what_the_loop_reads(tail: bytes) -> None:
    data = b"xx" + tail

    def bad(msg: str) -> CorruptMetadataError:
        return CorruptMetadataError(msg, ledger_id=1)

    want = _loop_varint32(data, 2)
    if isinstance(want, tuple):
        assert _read_varint32(data, 2, bad) == want
    else:
        with pytest.raises(CorruptMetadataError, match=want):
            _read_varint32(data, 2, bad)
