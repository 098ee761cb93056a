"""v2 ("PreV3") binary messages: BookKeeper's ``BookieProtocol`` layouts, both directions.

Shared by the Python bookie (:mod:`bklib.bookie.v2`, which decodes requests and encodes replies)
and the v2 client (:mod:`bklib.client.connection_v2`, the reverse). Every function here is pure:
bytes in, bytes or values out. Layouts (all big-endian, after the 4-byte frame length):

* header int: ``version << 24 | opcode << 16 | flags`` (version 0: the opcode alone);
* ADD request: header, 20-byte master key, the entry as stored (it starts with ledgerId and
  entryId; Java's ``DigestManager`` writes the key and header in front of the digest header);
* READ request: header, ledgerId, entryId, the master key only when fencing;
* BATCH_READ request: header, ledgerId, startEntryId, requestId, maxCount (int), maxSize
  (long), the master key only when fencing;
* ADD / READ reply: header, rc, ledgerId, entryId, then (READ) the entry bytes;
* BATCH_READ reply: header, rc, ledgerId, startEntryId, requestId, then per entry a 4-byte
  length and the entry bytes (``ResponseEnDeCoderPreV3``).

Replies echo the request's version; the Java client matches ADD and READ replies by
(ledgerId, entryId, opcode) and BATCH_READ replies by requestId.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bklib.proto.framing import FramingError

# BookieProtocol.CURRENT_PROTOCOL_VERSION: what the Java client sends.
PROTOCOL_VERSION = 2

# BookieProtocol opcodes (4..6 exist in Java; neither our bookie nor our client uses them).
ADD_ENTRY, READ_ENTRY, AUTH, READ_LAC, WRITE_LAC, GET_BOOKIE_INFO, BATCH_READ_ENTRY = range(1, 8)
OP_NAMES = {
    ADD_ENTRY: "ADD_ENTRY",
    READ_ENTRY: "READ_ENTRY",
    AUTH: "AUTH",
    BATCH_READ_ENTRY: "BATCH_READ_ENTRY",
}

# BookieProtocol.FLAG_*.
FLAG_DO_FENCING, FLAG_RECOVERY_ADD, FLAG_HIGH_PRIORITY = 0x1, 0x2, 0x4
MASTER_KEY_LENGTH = 20

LEN = struct.Struct(">I")
IDS = struct.Struct(">qq")  # ledgerId, entryId
HEADER = struct.Struct(">i")
# length, header, rc, ledgerId, entryId: ADD replies, READ replies before the body.
ADD_RESPONSE = struct.Struct(">Iiiqq")
READ_RESPONSE_HEADER = ADD_RESPONSE
READ_REQUEST = struct.Struct(">Iiqq")  # length, header, ledgerId, entryId
BATCH_READ_REQUEST = struct.Struct(">qqqiq")  # ledgerId, startEntryId, requestId, maxCount, maxSize
BATCH_READ_RESPONSE_HEADER = struct.Struct(">Iiiqqq")  # length, header, rc, ledger, start, reqId
_FULL_BATCH_REQUEST = struct.Struct(">Ii" + BATCH_READ_REQUEST.format[1:])
_RESPONSE_BODY = struct.Struct(">iiqq")  # header, rc, ledgerId, entryId: a reply without length
_BATCH_RESPONSE_BODY = struct.Struct(">iiqqq")

# Bytes of an ADD / READ reply after the length (RESPONSE_HEADERS_SIZE), and of a BATCH_READ one.
RESPONSE_HEADER_SIZE = _RESPONSE_BODY.size
BATCH_RESPONSE_HEADER_SIZE = _BATCH_RESPONSE_BODY.size


class MalformedV2Frame(FramingError):
    """A v2 frame that cannot be decoded (truncated, unknown opcode, bad entry lengths)."""


def packet_header(version: int, op: int, flags: int = 0) -> int:
    """``BookieProtocol.PacketHeader.toInt`` as a signed 32-bit int (what ``>i`` packs)."""
    if version == 0:
        return op
    value = ((version & 0xFF) << 24) | ((op & 0xFF) << 16) | (flags & 0xFFFF)
    return value - (1 << 32) if value >= 1 << 31 else value


def parse_header(header: int) -> tuple[int, int, int]:
    """(version, opcode, flags) of a header int (version 0: the int is the opcode, no flags)."""
    version = (header >> 24) & 0xFF
    if version == 0:
        return 0, header & 0xFF, 0
    return version, (header >> 16) & 0xFF, header & 0xFFFF


# ---- requests (client side) ---------------------------------------------------------------------


def _key(master_key: bytes | None) -> bytes:
    if master_key is None or len(master_key) != MASTER_KEY_LENGTH:
        got = "none" if master_key is None else f"{len(master_key)} bytes"
        raise ValueError(f"a v2 master key is {MASTER_KEY_LENGTH} bytes, got {got}")
    return master_key


def _flags(*, fence: bool = False, recovery: bool = False, high_priority: bool = False) -> int:
    return (
        (FLAG_DO_FENCING if fence else 0)
        | (FLAG_RECOVERY_ADD if recovery else 0)
        | (FLAG_HIGH_PRIORITY if high_priority else 0)
    )


def encode_add(
    ledger_id: int,
    entry_id: int,
    master_key: bytes,
    body: bytes,
    *,
    recovery: bool = False,
    high_priority: bool = False,
) -> bytes:
    """A framed ADD request. ``body`` is the entry as stored (bklib.digest layout), whose first
    16 bytes must be ``ledger_id`` and ``entry_id``: the bookie takes the ids from there."""
    if len(body) < IDS.size or IDS.unpack_from(body, 0) != (ledger_id, entry_id):
        raise ValueError(f"entry body does not start with ledger {ledger_id}, entry {entry_id}")
    header = packet_header(
        PROTOCOL_VERSION, ADD_ENTRY, _flags(recovery=recovery, high_priority=high_priority)
    )
    return (
        LEN.pack(4 + MASTER_KEY_LENGTH + len(body)) + HEADER.pack(header) + _key(master_key) + body
    )


def encode_read(
    ledger_id: int,
    entry_id: int,
    *,
    fence: bool = False,
    master_key: bytes | None = None,
    high_priority: bool = False,
) -> bytes:
    """A framed READ request; the master key is sent only with ``fence`` (as Java does), which
    needs it."""
    header = packet_header(
        PROTOCOL_VERSION, READ_ENTRY, _flags(fence=fence, high_priority=high_priority)
    )
    if not fence:
        return READ_REQUEST.pack(20, header, ledger_id, entry_id)
    key = _key(master_key)
    return READ_REQUEST.pack(20 + MASTER_KEY_LENGTH, header, ledger_id, entry_id) + key


def encode_batch_read(
    ledger_id: int,
    start_entry_id: int,
    request_id: int,
    max_count: int,
    max_size: int,
    *,
    fence: bool = False,
    master_key: bytes | None = None,
    high_priority: bool = False,
) -> bytes:
    """A framed BATCH_READ request (``RequestEnDeCoderPreV3``); the key only with ``fence``."""
    header = packet_header(
        PROTOCOL_VERSION, BATCH_READ_ENTRY, _flags(fence=fence, high_priority=high_priority)
    )
    size = 4 + BATCH_READ_REQUEST.size
    key = _key(master_key) if fence else b""
    return (
        _FULL_BATCH_REQUEST.pack(
            size + len(key), header, ledger_id, start_entry_id, request_id, max_count, max_size
        )
        + key
    )


# ---- replies (bookie side) ----------------------------------------------------------------------


def encode_add_response(version: int, rc: int, ledger_id: int, entry_id: int) -> bytes:
    """A framed ADD reply with v2 rc ``rc``."""
    header = packet_header(version, ADD_ENTRY)
    return ADD_RESPONSE.pack(RESPONSE_HEADER_SIZE, header, rc, ledger_id, entry_id)


def encode_read_response(
    version: int, rc: int, ledger_id: int, entry_id: int, body: bytes = b""
) -> bytes:
    """A framed READ reply: the entry bytes follow the ids (none on error)."""
    header = packet_header(version, READ_ENTRY)
    size = RESPONSE_HEADER_SIZE + len(body)
    return READ_RESPONSE_HEADER.pack(size, header, rc, ledger_id, entry_id) + body


def encode_batch_read_response(
    version: int,
    rc: int,
    ledger_id: int,
    start_entry_id: int,
    request_id: int,
    bodies: list[bytes] | tuple[bytes, ...] = (),
) -> bytes:
    """A framed BATCH_READ reply: each entry preceded by its 4-byte length."""
    payload = b"".join(LEN.pack(len(b)) + b for b in bodies)
    header = packet_header(version, BATCH_READ_ENTRY)
    return (
        BATCH_READ_RESPONSE_HEADER.pack(
            BATCH_RESPONSE_HEADER_SIZE + len(payload),
            header,
            rc,
            ledger_id,
            start_entry_id,
            request_id,
        )
        + payload
    )


# ---- replies (client side) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Response:
    """A decoded ADD or READ reply (``body`` empty for ADD and for failed reads)."""

    version: int
    op: int
    rc: int
    ledger_id: int
    entry_id: int
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class BatchReadResponse:
    """A decoded BATCH_READ reply; ``total_size`` is the frame's size with its length prefix,
    what the bookie compares with maxSize."""

    version: int
    rc: int
    ledger_id: int
    start_entry_id: int
    request_id: int
    entries: list[bytes]
    total_size: int

    op = BATCH_READ_ENTRY


def decode_response(frame: bytes) -> Response | BatchReadResponse:
    """Decode one reply frame (without its length prefix). Raises MalformedV2Frame for anything
    ``ResponseEnDeCoderPreV3`` would not decode, and for the slack it tolerates: trailing bytes
    after an ADD reply or after the last batch entry, and AUTH or unknown opcodes (a client that
    sent no AUTH request expects none)."""
    n = len(frame)
    if n < 4:
        raise MalformedV2Frame(f"v2 reply of {n} bytes has no header")
    version, op, _ = parse_header(HEADER.unpack_from(frame, 0)[0])
    if op in (ADD_ENTRY, READ_ENTRY):
        if n < RESPONSE_HEADER_SIZE:
            raise MalformedV2Frame(f"truncated v2 {OP_NAMES[op]} reply ({n} bytes)")
        _, rc, ledger_id, entry_id = _RESPONSE_BODY.unpack_from(frame, 0)
        if op == ADD_ENTRY:
            if n != RESPONSE_HEADER_SIZE:
                raise MalformedV2Frame(f"v2 ADD_ENTRY reply of {n} bytes, expected 24")
            return Response(version, op, rc, ledger_id, entry_id)
        return Response(version, op, rc, ledger_id, entry_id, frame[RESPONSE_HEADER_SIZE:])
    if op == BATCH_READ_ENTRY:
        if n < BATCH_RESPONSE_HEADER_SIZE:
            raise MalformedV2Frame(f"truncated v2 BATCH_READ_ENTRY reply ({n} bytes)")
        _, rc, ledger_id, start, request_id = _BATCH_RESPONSE_BODY.unpack_from(frame, 0)
        entries: list[bytes] = []
        pos = BATCH_RESPONSE_HEADER_SIZE
        unpack_len = LEN.unpack_from
        while pos < n:
            if n - pos < 4:
                raise MalformedV2Frame(
                    f"v2 BATCH_READ_ENTRY reply ends with {n - pos} bytes of an entry length"
                )
            (size,) = unpack_len(frame, pos)
            pos += 4
            if size > n - pos:
                raise MalformedV2Frame(
                    f"v2 BATCH_READ_ENTRY entry {len(entries)} announces {size} bytes, "
                    f"{n - pos} left in the frame"
                )
            entries.append(frame[pos : pos + size])
            pos += size
        return BatchReadResponse(version, rc, ledger_id, start, request_id, entries, n + 4)
    raise MalformedV2Frame(f"unexpected v2 reply opcode {op} (version {version})")
