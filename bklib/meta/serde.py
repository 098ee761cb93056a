"""Ledger metadata znode bytes <-> LedgerMetadata, as BookKeeper 4.17's LedgerMetadataSerDe.

Every znode starts with ``BookieMetadataFormatVersion\\t<v>\\n``. Version 3 is a varint32-delimited
binary ``LedgerMetadataFormat``, version 2 its text format, version 1 a legacy line format
(quorum, ensemble size, length, one tab-separated line per segment, then ``<last>\tCLOSED``).
The version read is kept in ``LedgerMetadata.format_version`` and written back, as BookKeeper
does, so a v1 or v2 ledger stays v1 or v2 across updates (repair CAS, close).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import cast

from google.protobuf import text_format
from google.protobuf.message import DecodeError, EncodeError

from bklib.errors import CompatibilityError, CorruptMetadataError
from bklib.meta.model import (
    INVALID_ENTRY_ID,
    DigestType,
    LedgerMetadata,
    LedgerState,
    Segment,
)
from bklib.proto.formats_pb2 import LedgerMetadataFormat
from bklib.records import frozen_record

__all__ = [
    "CURRENT_FORMAT_VERSION",
    "HEADER_PREFIX",
    "decode_metadata",
    "encode_metadata",
    "metadata_header",
]

HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
CURRENT_FORMAT_VERSION = 3

# BookKeeper reads at most this many bytes after the prefix, the newline included.
_MAX_VERSION_DIGITS = 10
# v1 marks IN_RECOVERY as a "closed" line with this entry id.
_V1_IN_RECOVERY_ENTRY_ID = -102
_V1_CLOSED_TAG = "CLOSED"

_INT_RE = re.compile(r"[+-]?[0-9]+")
# BufferedReader.readLine's line terminators.
_JAVA_LINE_RE = re.compile(r"\r\n|\r|\n")


def split_java_lines(text: str, maxsplit: int = 0) -> list[str]:
    """``text`` cut where Java's ``BufferedReader.readLine`` ends a line (CRLF, CR or LF):
    how BookKeeper reads its text formats (v1/v2 ledger metadata, cookies, UR marks)."""
    return _JAVA_LINE_RE.split(text, maxsplit=maxsplit)


_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

# Builds the error to raise, so the ledger id is attached in one place.
_BadFn = Callable[[str], CorruptMetadataError]


def metadata_header(version: int) -> bytes:
    """The header line BookKeeper writes before metadata of format ``version``."""
    return HEADER_PREFIX + str(version).encode("ascii") + b"\n"


# ---- decoding ---------------------------------------------------------------------------------


def decode_metadata(
    data: bytes, ledger_id: int, *, znode_ctime_ms: int | None = None
) -> LedgerMetadata:
    """Parse a ledger znode's data as BookKeeper's reader would.

    ``znode_ctime_ms`` (the znode's Stat ctime) becomes ``ctime`` when the metadata does not
    carry one. Any malformed or invalid input raises CorruptMetadataError naming the ledger,
    as does a segment keyed below entry 0 or a closed ledger of 2^63 entries.
    """

    def bad(msg: str) -> CorruptMetadataError:
        return CorruptMetadataError(msg, ledger_id=ledger_id)

    data = bytes(data)
    version, pos = _read_header(data, bad)
    if version == 1:
        md = _decode_v1(data[pos:], ledger_id, znode_ctime_ms, bad)
    else:
        msg = _parse_v3(data, pos, bad) if version == 3 else _parse_v2(data[pos:], bad)
        md = _from_proto(msg, ledger_id, version, znode_ctime_ms, bad)
    md.validate()
    # No entry id is negative, so a segment keyed below 0 cannot be audited or repaired (the
    # stripe arithmetic rejects it): the ledger is corrupt, not checked. Keys strictly
    # increase, so only the first can be negative.
    first = md.segments[0].first_entry_id
    if first < 0:
        raise bad(f"first segment starts at negative entry id {first}")
    # Entry counts are longs (table columns too): a closed ledger of 2^63 entries is corrupt.
    if md.last_entry_id >= _INT64[1]:
        raise bad(f"lastEntryId {md.last_entry_id}: the entry count does not fit a long")
    return md


_V3_HEADER = HEADER_PREFIX + b"3\n"
"""The header of nearly every znode a scan reads: recognised whole, without parsing."""


def _read_header(data: bytes, bad: _BadFn) -> tuple[int, int]:
    """Return (format version, offset of the body)."""
    if data.startswith(_V3_HEADER):
        return 3, len(_V3_HEADER)
    if not data.startswith(HEADER_PREFIX):
        for i, want in enumerate(HEADER_PREFIX):
            if i >= len(data) or data[i] != want:
                raise bad(f"ledger metadata header corrupt at byte {i}")
    start = len(HEADER_PREFIX)
    end = data.find(b"\n", start, start + _MAX_VERSION_DIGITS)
    if end < 0:
        raise bad("cannot find the end of the metadata format version in the header")
    raw = data[start:end]
    try:
        version = _java_int(raw.decode("ascii"), _INT32)
    except (UnicodeDecodeError, ValueError):
        raise bad(f"unparsable metadata format version {raw!r}") from None
    if version not in (1, 2, 3):
        raise bad(f"metadata format version {version} not supported (expected 1 to 3)")
    return version, end + 1


def _parse_v3(data: bytes, pos: int, bad: _BadFn) -> LedgerMetadataFormat:
    size, pos = _read_varint32(data, pos, bad)
    body = data[pos : pos + size]
    if len(body) < size:
        raise bad(f"truncated v3 metadata: length prefix {size}, only {len(body)} bytes follow")
    # Bytes after the delimited message are ignored, as BookKeeper does.
    msg = LedgerMetadataFormat()
    try:
        msg.MergeFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise bad(f"undecodable v3 metadata: {exc}") from None
    return msg


def _read_varint32(data: bytes, pos: int, bad: _BadFn) -> tuple[int, int]:
    """Read the length prefix like protobuf-java's readRawVarint32 from a stream.

    Up to 10 bytes are allowed (a negative int32 is written sign-extended); only the low
    32 bits count.
    """
    # One or two bytes, a body under 16 KiB: nearly every znode, without the loop.
    if pos + 1 < len(data):
        b0, b1 = data[pos], data[pos + 1]
        if b0 < 0x80:
            return b0, pos + 1
        if b1 < 0x80:
            return (b0 & 0x7F) | (b1 << 7), pos + 2
    value = 0
    for i in range(10):
        if pos + i >= len(data):
            raise bad("truncated v3 metadata: missing or incomplete length prefix")
        b = data[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            value &= 0xFFFFFFFF
            if value >= 2**31:
                raise bad(f"negative v3 length prefix {value - 2**32}")
            return value, pos + i + 1
    raise bad("malformed varint length prefix in v3 metadata")


def _parse_v2(body: bytes, bad: _BadFn) -> LedgerMetadataFormat:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad(f"v2 metadata is not UTF-8: {exc}") from None
    msg = LedgerMetadataFormat()
    try:
        # Merge, not Parse: protobuf-java's TextFormat.merge lets a repeated singular field
        # overwrite the earlier value instead of failing.
        text_format.Merge(text, msg)
    except (text_format.ParseError, ValueError, UnicodeDecodeError) as exc:
        raise bad(f"unparsable v2 metadata text: {exc}") from None
    return msg


# Enum lookups by value, without the Enum call's machinery (a scan decodes a million).
_LEDGER_STATES = {s.value: s for s in LedgerState}
_DIGEST_TYPES = {d.value: d for d in DigestType}


def _from_proto(
    msg: LedgerMetadataFormat,
    ledger_id: int,
    version: int,
    znode_ctime_ms: int | None,
    bad: _BadFn,
) -> LedgerMetadata:
    if not msg.IsInitialized():  # the cheaper test first; the names only for the error
        missing = msg.FindInitializationErrors()
        raise bad(f"missing required field(s): {', '.join(missing)}")
    state = _LEDGER_STATES.get(msg.state)
    if state is None:
        state = LedgerState(msg.state)
    if state == LedgerState.CLOSED:
        last_entry_id, length = msg.lastEntryId, msg.length
    else:
        # BookKeeper ignores what an unclosed ledger stores here.
        last_entry_id, length = INVALID_ENTRY_ID, 0
    if msg.HasField("password"):
        password: bytes | None = _password(msg.password)
        # An absent digestType reads as proto2's default, the first value: CRC32.
        digest: DigestType | None = _DIGEST_TYPES.get(msg.digestType)
        if digest is None:
            digest = DigestType(msg.digestType)
    else:
        password, digest = None, None
    custom: dict[str, bytes] = {}
    for entry in msg.customMetadata:
        key = _pb_str(entry.key)
        if key in custom:
            # 4.17 collects these with Collectors.toMap, which throws on a duplicate key.
            raise bad(f"duplicate custom metadata key {key!r}")
        custom[key] = entry.value
    ctime: int | None
    if msg.HasField("ctime"):
        ctime, store_ctime = msg.ctime, True
    else:
        ctime, store_ctime = znode_ctime_ms, False
    write_quorum = msg.quorumSize
    # Every value is already in the form LedgerMetadata's __post_init__ gives (a tuple of
    # Segments of tuples, the enums, a dict of our own), so it is stored as it is: a scan
    # builds a million of these (bklib/records.py).
    return frozen_record(
        LedgerMetadata,
        {
            "ledger_id": ledger_id,
            "ensemble_size": msg.ensembleSize,
            "write_quorum": write_quorum,
            "ack_quorum": msg.ackQuorumSize if msg.HasField("ackQuorumSize") else write_quorum,
            "segments": tuple(
                [Segment(s.firstEntryId, _members(s.ensembleMember)) for s in msg.segment]
            ),
            "state": state,
            "last_entry_id": last_entry_id,
            "length": length,
            "digest_type": digest,
            "password": password,
            "ctime": ctime,
            "store_ctime": store_ctime,
            "custom_metadata": custom,
            "ctoken": msg.cToken,
            "format_version": version,
        },
    )


_SHARED_MAX = 1 << 16
"""Distinct values a table of shared values holds before it starts again (so a cluster of
garbage names or per-ledger passwords cannot grow it without bound)."""

_BOOKIE_IDS: dict[str, str] = {}
_PASSWORDS: dict[bytes, bytes] = {}


def _shared_table(table: dict[str, str] | dict[bytes, bytes]) -> None:
    """Empty ``table`` once it is full: what was shared stays valid, new values start over."""
    if len(table) > _SHARED_MAX:
        table.clear()


def _members(members: Iterable[str | bytes]) -> tuple[str, ...]:
    """An ensemble's bookie ids, each the one shared object for its id: a scan holds every
    ledger's ensembles at once, and a few hundred bookies named by a million ledgers would
    otherwise be millions of equal strings (most of a view's memory, docs/benchmarks.md).
    The per-member fix-up only when one is not text."""
    ids = tuple(members)
    try:
        "".join(ids)  # type: ignore[arg-type]  # the cheapest test that every one is text
    except TypeError:
        ids = tuple(_pb_str(m) for m in ids)
    _shared_table(_BOOKIE_IDS)
    return tuple(map(_BOOKIE_IDS.setdefault, ids, ids))  # type: ignore[arg-type]


def _password(value: bytes) -> bytes:
    """``value``, shared with every equal password decoded before (Pulsar gives all of a
    cluster's ledgers the same one)."""
    _shared_table(_PASSWORDS)
    return _PASSWORDS.setdefault(value, value)


def _pb_str(value: str | bytes) -> str:
    # Python protobuf hands back bytes for a proto2 string that is not UTF-8; protobuf-java
    # decodes it with replacement characters, so do the same (validation then judges it).
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _decode_v1(
    body: bytes, ledger_id: int, znode_ctime_ms: int | None, bad: _BadFn
) -> LedgerMetadata:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad(f"v1 metadata is not UTF-8: {exc}") from None
    lines = split_java_lines(text) if text else []
    if lines and lines[-1] == "":  # a final terminator does not start another line
        lines.pop()
    if len(lines) < 3:
        raise bad(f"v1 metadata has {len(lines)} line(s), need quorum, ensemble and length")
    try:
        write_quorum = _java_int(lines[0], _INT32)
        ensemble_size = _java_int(lines[1], _INT32)
        stored_length = _java_int(lines[2], _INT64)
    except ValueError as exc:
        raise bad(f"bad number in v1 metadata: {exc}") from None
    state, last_entry_id, length = LedgerState.OPEN, INVALID_ENTRY_ID, 0
    segments: list[Segment] = []
    for line in lines[3:]:
        parts = _java_split_tab(line)
        if len(parts) < 2:
            raise bad(f"v1 metadata line {line!r} has no tab-separated fields")
        try:
            entry_id = _java_int(parts[0], _INT64)
        except ValueError as exc:
            raise bad(f"bad entry id in v1 metadata line {line!r}: {exc}") from None
        if parts[1] == _V1_CLOSED_TAG:
            # The reader stops at the first CLOSED line; anything after it is ignored.
            if entry_id == _V1_IN_RECOVERY_ENTRY_ID:
                state = LedgerState.IN_RECOVERY
            else:
                state, last_entry_id, length = LedgerState.CLOSED, entry_id, stored_length
            break
        segments.append(Segment(entry_id, tuple(parts[1:])))
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=write_quorum,
        segments=tuple(segments),
        state=state,
        last_entry_id=last_entry_id,
        length=length,
        digest_type=None,
        password=None,
        ctime=znode_ctime_ms,
        store_ctime=False,
        format_version=1,
    )


def _java_int(s: str, bounds: tuple[int, int]) -> int:
    """Integer.parseInt / Long.parseLong: ASCII digits, optional sign, no spaces, in range."""
    if not _INT_RE.fullmatch(s):
        raise ValueError(f"not an integer: {s!r}")
    v = int(s)
    if not bounds[0] <= v <= bounds[1]:
        raise ValueError(f"out of range: {s}")
    return v


def _java_split_tab(line: str) -> list[str]:
    """String.split("\\t"): trailing empty strings are dropped; without a tab, [line]."""
    if "\t" not in line:
        return [line]
    parts = line.split("\t")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


# ---- encoding ---------------------------------------------------------------------------------


def encode_metadata(md: LedgerMetadata) -> bytes:
    """The znode bytes BookKeeper would write for ``md`` in ``md.format_version`` (1, 2 or 3).

    Raises CorruptMetadataError for metadata BookKeeper would refuse to write, and
    CompatibilityError for v1 metadata holding what format v1 cannot store (see _encode_v1).
    """
    md.validate()
    version = md.format_version
    if version == 1:
        return _encode_v1(md)
    msg = _to_proto(md, with_ctoken=version == 3)
    try:
        if version == 3:
            body: bytes = msg.SerializeToString()
            return metadata_header(3) + _varint(len(body)) + body
        # as_utf8=False: like protobuf-java's printer, escape non-ASCII bytes as octal.
        text: str = text_format.MessageToString(msg, as_utf8=False)
        return metadata_header(2) + text.encode("ascii")
    except (EncodeError, ValueError, UnicodeEncodeError) as exc:
        raise CorruptMetadataError(
            f"cannot serialise metadata: {exc}", ledger_id=md.ledger_id
        ) from None


def _to_proto(md: LedgerMetadata, *, with_ctoken: bool) -> LedgerMetadataFormat:
    def bad(msg: str) -> CorruptMetadataError:
        return CorruptMetadataError(msg, ledger_id=md.ledger_id)

    if md.password is None or md.digest_type is None:
        # Java would hit a null digest type here: v1-era metadata without a password cannot
        # be written as v2/v3.
        raise bad("metadata without password and digest type cannot be written as v2/v3")
    if md.store_ctime and md.ctime is None:
        raise bad("store_ctime is set but ctime is None")
    closed = md.state == LedgerState.CLOSED
    msg = LedgerMetadataFormat()
    try:
        msg.quorumSize = md.write_quorum
        msg.ensembleSize = md.ensemble_size
        msg.length = md.length if closed else 0
        msg.lastEntryId = md.last_entry_id if closed else INVALID_ENTRY_ID
        # The stubs type enum fields as their enum class; the values are plain ints at run time.
        msg.state = cast("LedgerMetadataFormat.State", int(md.state))
        for seg in md.segments:
            s = msg.segment.add()
            s.ensembleMember.extend(seg.ensemble)
            s.firstEntryId = seg.first_entry_id
        msg.digestType = cast("LedgerMetadataFormat.DigestType", int(md.digest_type))
        msg.password = bytes(md.password)
        msg.ackQuorumSize = md.ack_quorum
        if md.store_ctime and md.ctime is not None:
            msg.ctime = md.ctime
        for key, value in md.custom_metadata.items():
            msg.customMetadata.add(key=key, value=bytes(value))
        if with_ctoken:
            msg.cToken = md.ctoken
    except (ValueError, TypeError) as exc:
        raise bad(f"value out of range for the metadata format: {exc}") from None
    return msg


def _encode_v1(md: LedgerMetadata) -> bytes:
    """``LedgerMetadataSerDe.serializeVersion1``, byte for byte.

    Lines end in ``\n``; the state line (``<lastEntryId>\tCLOSED``, or ``-102\tCLOSED`` in
    recovery) has no terminator and an open ledger has none. Format v1 has no ack quorum,
    password, digest type, ctime, custom metadata or cToken. BookKeeper drops them silently;
    metadata decoded from a v1 znode never has them (ack quorum = write quorum, the rest
    absent), so a v1 ledger rewritten here is what BookKeeper would write. Metadata that does
    carry one is refused with CompatibilityError instead of losing it (a password or digest
    type the readers would no longer see).
    """
    lost = []
    if md.ack_quorum != md.write_quorum:
        lost.append(f"ack quorum {md.ack_quorum} != write quorum {md.write_quorum}")
    if md.password is not None or md.digest_type is not None:
        lost.append("password and digest type")
    if md.store_ctime:
        lost.append("ctime")
    if md.custom_metadata:
        lost.append("custom metadata")
    if md.ctoken != 0:
        lost.append("cToken")
    if lost:
        raise CompatibilityError(
            f"ledger metadata format v1 cannot store: {', '.join(lost)}", ledger_id=md.ledger_id
        )
    lines = [str(md.write_quorum), str(md.ensemble_size), str(md.length)]
    lines += ["\t".join([str(s.first_entry_id), *s.ensemble]) for s in md.segments]
    text = "".join(line + "\n" for line in lines)
    if md.state == LedgerState.IN_RECOVERY:
        text += f"{_V1_IN_RECOVERY_ENTRY_ID}\t{_V1_CLOSED_TAG}"
    elif md.state == LedgerState.CLOSED:
        text += f"{md.last_entry_id}\t{_V1_CLOSED_TAG}"
    # Bookie ids are ASCII (validate() checked them); Java writes UTF-8.
    return metadata_header(1) + text.encode("utf-8")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
