"""The scan's records built without ``__init__`` (bklib/records.py) are the records ``__init__``
builds: every field named, each in its normal form, equal, hashable, picklable and frozen."""

from __future__ import annotations

import dataclasses
import pickle
import struct
from typing import Any

import pytest

from bklib.audit.model import LedgerView, segment_spans
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
from bklib.meta.stores.zookeeper import _value_read
from bklib.meta.zkbulk import _STAT, GetResult, _get_data_at
from bklib.records import field_names, frozen_record

B = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")


def _as_init_builds_it(obj: Any) -> None:
    """``obj`` names every field of its class, and equals what ``__init__`` builds of the same
    values (``__post_init__`` included: it would have normalised what was not normal)."""
    cls = type(obj)
    assert set(vars(obj)) == field_names(cls), cls.__name__
    again = cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)})
    assert again == obj
    assert vars(again) == vars(obj)
    assert cls is LedgerMetadata or hash(again) == hash(obj)  # its dict field is unhashable
    assert pickle.loads(pickle.dumps(obj)) == obj
    with pytest.raises(dataclasses.FrozenInstanceError):
        obj.ledger_id = 1


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


@pytest.mark.parametrize("md", CASES, ids=range(len(CASES)))
def test_spans_end_where_segment_last_entry_id_says(md: LedgerMetadata) -> None:
    spans = segment_spans(md)
    for i, span in enumerate(spans):
        if i == len(spans) - 1 and not md.is_closed:
            assert span.last_entry_id is None
            assert md.segment_last_entry_id(i) == -1 and md.segment_last_entry_id(i, 77) == 77
        else:
            assert span.last_entry_id == md.segment_last_entry_id(i)
        assert span.ensemble == md.segments[i].ensemble


def test_a_closed_ledger_ends_its_middle_segments_at_its_last_entry() -> None:
    md = _metadata(True, 3).replace(last_entry_id=120, length=1)
    assert md.segment_ends() == [99, 120, 120]
    assert [s.last_entry_id for s in segment_spans(md)] == [99, 120, 120]


def test_the_bulk_reader_and_the_store_build_their_reads_as_init_does() -> None:
    stat = struct.pack(">qqqqiiiqiiq", 1, 2, 3, 4, 5, 6, 7, 0x1234, 9, 10, 11)
    frame = struct.pack(">i", 3) + b"abc" + stat
    got, off = _get_data_at("/ledgers/L1", frame, 0)
    assert off == len(frame) == 7 + _STAT.size
    _as_init_builds_it_plain(got)
    _as_init_builds_it_plain(got.stat)
    assert (got.stat.ctime, got.stat.mtime, got.stat.version, got.stat.ephemeral_owner) == (
        3, 4, 5, 0x1234
    )  # fmt: skip
    read = _value_read(got)
    _as_init_builds_it_plain(read)
    assert read.stat is not None
    _as_init_builds_it_plain(read.stat)
    assert read.stat.ephemeral_owner == "0x1234" and read.stat.child_version == 6


def test_a_scan_result_is_built_as_init_does() -> None:
    md = _metadata(True, 2)
    data = encode_metadata(md)
    frame = struct.pack(">i", len(data)) + data + struct.pack(">qqqqiiiqiiq", *range(11))
    got, _ = _get_data_at(paths.ledger_path("/ledgers", 4242), frame, 0)
    result = _to_result(4242, _value_read(got))
    assert isinstance(result, ScanResult)
    _as_init_builds_it_plain(result)
    assert result.metadata == md.replace(ctime=2) and result.version == 4  # ctime: the znode's


def _as_init_builds_it_plain(obj: Any) -> None:
    cls = type(obj)
    assert set(vars(obj)) == field_names(cls), cls.__name__
    again = cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)})
    assert again == obj
    if cls is not ScanResult:  # the others hold no dict
        assert hash(again) == hash(obj)
    assert pickle.loads(pickle.dumps(obj)) == obj


def test_frozen_record_takes_the_values_as_they_are() -> None:
    got = frozen_record(GetResult, {"path": "/p", "data": None, "stat": None, "err": -101})
    assert got == GetResult("/p", None, None, -101) and got.error_name == "NONODE"
    read = frozen_record(ValueRead, {"path": "/p", "data": None, "stat": None, "error": None})
    assert read.missing


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 2**21, 2**31 - 1])
def test_the_length_prefix_fast_path_reads_what_the_loop_reads(value: int) -> None:
    raw = bytearray()
    v = value
    while True:
        byte, v = v & 0x7F, v >> 7
        raw.append(byte | (0x80 if v else 0))
        if not v:
            break
    data = b"xx" + bytes(raw) + b"body"

    def bad(msg: str) -> CorruptMetadataError:
        return CorruptMetadataError(msg, ledger_id=1)

    assert _read_varint32(data, 2, bad) == (value, 2 + len(raw))
