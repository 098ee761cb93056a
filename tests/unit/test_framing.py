"""Frame encoding/decoding, v2 detection, status mapping and the v3 protobuf wire bytes."""

from __future__ import annotations

import asyncio
import struct

import pytest

from bklib import errors
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import (
    MAX_FRAME_SIZE,
    FrameTooLarge,
    encode_frame,
    is_v2_frame,
    split_frames,
)
from bklib.proto.status import V2_TO_V3, V3_TO_V2, error_for_status, status_name
from bklib.testing.frames import read_frame, write_frame


def test_fencing_read_is_the_bytes_protobuf_java_writes() -> None:
    """The exact bytes protobuf-java produces for a Java recovery read of entry -1."""
    req = pb.Request()
    req.header.version = pb.VERSION_THREE
    req.header.operation = pb.READ_ENTRY
    req.header.txnId = 1
    req.header.priority = 100
    r = req.readRequest
    r.ledgerId = 1
    r.entryId = -1
    r.masterKey = bytes.fromhex("850bf1071c5e3d8c24235676f8816ae0cbe2f14f")
    r.flag = pb.ReadRequest.FENCE_LEDGER
    expected = (
        "00000033"
        "0a080803100118012064a20626080110ffffffffffffffffff011a14"
        "850bf1071c5e3d8c24235676f8816ae0cbe2f14fa00601"
    )
    assert encode_frame(req.SerializeToString()).hex() == expected


def test_enum_and_field_numbers() -> None:
    assert [pb.StatusCode.Value(n) for n in ("ENOLEDGER", "EIO", "EUNKNOWNLEDGERSTATE")] == [
        402,
        501,
        507,
    ]
    assert pb.GET_LIST_OF_ENTRIES_OF_LEDGER == 11 and pb.BATCH_READ_ENTRY == 12
    assert pb.Request.DESCRIPTOR.fields_by_name["getListOfEntriesOfLedgerRequest"].number == 108
    assert pb.Response.DESCRIPTOR.fields_by_name["readResponse"].number == 100
    assert pb.ReadResponse.DESCRIPTOR.fields_by_name["lacUpdateTimestamp"].number == 6
    assert pb.GetBookieInfoRequest.FREE_DISK_SPACE == 2
    # Missing required fields are detectable (upb does not refuse them on parse).
    assert not pb.Request.FromString(b"\x0a\x02\x08\x03").IsInitialized()


def test_split_frames_keeps_partial_tail_and_rejects_huge() -> None:
    buf = bytearray(encode_frame(b"abc") + encode_frame(b"") + encode_frame(b"xyz")[:5])
    assert split_frames(buf) == [b"abc", b""]
    assert bytes(buf) == encode_frame(b"xyz")[:5]
    buf += b"yz"
    assert split_frames(buf) == [b"xyz"] and not buf
    with pytest.raises(FrameTooLarge):
        split_frames(bytearray(struct.pack(">I", MAX_FRAME_SIZE - 3)))
    with pytest.raises(FrameTooLarge):
        split_frames(bytearray(struct.pack(">i", -1)))
    # Exactly at the limit (N + 4 == max) is accepted, as in Netty.
    assert split_frames(bytearray(struct.pack(">I", 6) + b"123456"), max_frame=10) == [b"123456"]


def test_stream_read_write_frame() -> None:
    async def go() -> None:
        got: list[bytes] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    got.append(await read_frame(reader, max_frame=64))
            except asyncio.IncompleteReadError:
                pass
            except FrameTooLarge:
                got.append(b"TOO-LARGE")
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        write_frame(writer, b"hello")
        write_frame(writer, b"")
        writer.write(struct.pack(">I", 1000))
        await writer.drain()
        assert await reader.read() == b""  # server closed after the oversized prefix
        writer.close()
        server.close()
        await server.wait_closed()
        assert got == [b"hello", b"", b"TOO-LARGE"]

    asyncio.run(go())


def test_is_v2_frame() -> None:
    assert is_v2_frame(struct.pack(">i", (2 << 24) | (1 << 16)))
    assert is_v2_frame(b"\x07\xff")
    assert is_v2_frame(b"")
    assert not is_v2_frame(b"\x0a\x08")


def test_status_mapping() -> None:
    cases = {
        pb.ENOENTRY: errors.NoSuchEntryError,
        pb.ENOLEDGER: errors.NoSuchLedgerError,
        pb.EFENCED: errors.LedgerFencedError,
        pb.EUA: errors.UnauthorizedAccessError,
        pb.EREADONLY: errors.WriteOnReadOnlyBookieError,
        pb.ETOOMANYREQUESTS: errors.TooManyRequestsError,
        pb.EUNKNOWNLEDGERSTATE: errors.DataUnknownError,
        pb.EBADVERSION: errors.ProtocolVersionError,
    }
    for status, cls in cases.items():
        err = error_for_status(status, pb.READ_ENTRY, ledger_id=3, entry_id=4, bookie="b:1")
        assert type(err) is cls
        assert (err.ledger_id, err.entry_id, err.bookie) == (3, 4, "b:1")
    for status in (pb.EIO, pb.EBADREQ, 999):
        assert type(error_for_status(status, pb.READ_ENTRY)) is errors.ReadError
        assert type(error_for_status(status, pb.READ_LAC)) is errors.ReadError
        assert type(error_for_status(status, pb.ADD_ENTRY)) is errors.WriteError
        assert type(error_for_status(status, pb.WRITE_LAC)) is errors.WriteError
        assert type(error_for_status(status, pb.FORCE_LEDGER)) is errors.WriteError
    assert "EIO" in str(error_for_status(pb.EIO, pb.ADD_ENTRY, ledger_id=1))
    assert status_name(999) == "status 999"
    with pytest.raises(ValueError):
        error_for_status(pb.EOK, pb.ADD_ENTRY)
    assert V2_TO_V3[104] == pb.EFENCED and V3_TO_V2[pb.EREADONLY] == 105
