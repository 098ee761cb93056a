"""Pulsar's metadata about its ledgers: the values of its managed-ledger, cursor and schema
keys, decoded (pure, no I/O).

* ``/managed-ledgers/<ml>``: ``ManagedLedgerInfo``, the ledgers of a topic in order. The last
  is the one being written; a ledger with ``offloadContext.bookkeeperDeleted`` was offloaded
  and deleted from BookKeeper on purpose (``ManagedLedgerImpl``).
* ``/managed-ledgers/<ml>/<cursor>``: ``ManagedCursorInfo``; ``cursorsLedgerId`` is the
  cursor's ledger, -1 when its position is kept in the value itself (``ManagedCursorImpl``).
* ``/schemas/<schema id>``: ``SchemaLocator``; every version's ledger is in ``index``
  (``BookkeeperSchemaStorage``).

A managed-ledger or cursor value larger than the broker's threshold may be compressed
(``MetaStoreImpl``, PIP-270): ``0x4778``, a 4-byte big-endian size, a ``ManagedInfoMetadata``
(codec and uncompressed size), then the compressed message. An empty value is an empty
message (a managed ledger just created). Anything that does not decode is a
:class:`CorruptPulsarMetadata` naming the key, never an empty reference list.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import TypeVar

import cramjam
from google.protobuf.message import DecodeError, Message

from bklib.proto.pulsar_formats_pb2 import (
    CompressionType,
    ManagedCursorInfo,
    ManagedInfoMetadata,
    ManagedLedgerInfo,
    SchemaLocator,
)

__all__ = [
    "NO_CURSOR_LEDGER",
    "CorruptPulsarMetadata",
    "CursorInfo",
    "ManagedLedger",
    "ManagedLedgerEntry",
    "decode_cursor",
    "decode_managed_ledger",
    "decode_schema_ledgers",
]

MAGIC = b"\x47\x78"
NO_CURSOR_LEDGER = -1

M = TypeVar("M", bound=Message)


class CorruptPulsarMetadata(ValueError):
    """A Pulsar metadata value that cannot be decoded; the message names its key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class ManagedLedgerEntry:
    """One ledger a managed ledger lists."""

    ledger_id: int
    entries: int | None
    """None for the ledger being written (the broker records the count when it closes it)."""
    bookkeeper_deleted: bool
    """Offloaded and deleted from BookKeeper on purpose: its absence is no loss."""


@dataclass(frozen=True)
class ManagedLedger:
    """A topic's managed ledger: its ledgers in order (the last one is being written)."""

    ledgers: tuple[ManagedLedgerEntry, ...]


@dataclass(frozen=True)
class CursorInfo:
    """A cursor: its ledger (None when its position lives in the value), and the ledger of
    the topic's compacted view when this is the ``__compaction`` cursor and says so."""

    cursor_ledger: int | None
    compacted_ledger: int | None
    mark_delete: tuple[int, int] | None


COMPACTED_TOPIC_LEDGER = "CompactedTopicLedger"
"""The ``__compaction`` cursor's property naming the compacted ledger (``Compactor``)."""


def _decompress(key: str, data: bytes) -> bytes:
    """The message bytes of a possibly compressed managed-ledger or cursor value."""
    if not data.startswith(MAGIC):
        return data
    if len(data) < 6:
        raise CorruptPulsarMetadata(key, "compression header truncated")
    (size,) = struct.unpack(">i", data[2:6])
    if size < 0 or 6 + size > len(data):
        raise CorruptPulsarMetadata(key, f"compression header size {size} out of range")
    header = _parse(key, ManagedInfoMetadata, data[6 : 6 + size], "compression header")
    body = data[6 + size :]
    codec = header.compressionType
    try:
        if codec == CompressionType.NONE:
            out = body
        elif codec == CompressionType.ZLIB:
            # Deflater with SYNC_FLUSH and no finish(): a stream without its final block.
            out = zlib.decompressobj().decompress(body)
        elif codec == CompressionType.LZ4:  # a raw LZ4 block, no frame
            out = bytes(cramjam.lz4.decompress_block(body, output_len=header.uncompressedSize))
        elif codec == CompressionType.ZSTD:
            out = bytes(cramjam.zstd.decompress(body))
        elif codec == CompressionType.SNAPPY:  # a raw snappy block, no framing
            out = bytes(cramjam.snappy.decompress_raw(body))
        else:
            raise CorruptPulsarMetadata(key, f"unknown compression type {codec}")
    except (zlib.error, cramjam.DecompressionError) as exc:
        name = CompressionType.Name(codec)
        raise CorruptPulsarMetadata(key, f"{name} decompression failed: {exc}") from None
    if len(out) != header.uncompressedSize:
        raise CorruptPulsarMetadata(
            key, f"decompressed {len(out)} bytes, header says {header.uncompressedSize}"
        )
    return out


def _parse(key: str, cls: type[M], data: bytes, what: str) -> M:
    msg: M = cls()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise CorruptPulsarMetadata(key, f"invalid {what}: {exc}") from None
    missing = msg.FindInitializationErrors()
    if missing:
        raise CorruptPulsarMetadata(key, f"{what} lacks {', '.join(missing)}")
    return msg


def decode_managed_ledger(key: str, data: bytes) -> ManagedLedger:
    """A ``/managed-ledgers/<ml>`` value. Raises :class:`CorruptPulsarMetadata`."""
    info = _parse(key, ManagedLedgerInfo, _decompress(key, data), "ManagedLedgerInfo")
    return ManagedLedger(
        tuple(
            ManagedLedgerEntry(
                li.ledgerId,
                li.entries if li.HasField("entries") else None,
                li.HasField("offloadContext") and li.offloadContext.bookkeeperDeleted,
            )
            for li in info.ledgerInfo
        )
    )


def decode_cursor(key: str, data: bytes) -> CursorInfo:
    """A ``/managed-ledgers/<ml>/<cursor>`` value. Raises :class:`CorruptPulsarMetadata`."""
    info = _parse(key, ManagedCursorInfo, _decompress(key, data), "ManagedCursorInfo")
    compacted = next(
        (p.value for p in info.properties if p.name == COMPACTED_TOPIC_LEDGER and p.value >= 0),
        None,
    )
    mark = (
        (info.markDeleteLedgerId, info.markDeleteEntryId)
        if info.HasField("markDeleteLedgerId")
        else None
    )
    cursor_ledger = info.cursorsLedgerId if info.cursorsLedgerId >= 0 else None
    return CursorInfo(cursor_ledger, compacted, mark)


def decode_schema_ledgers(key: str, data: bytes) -> tuple[int, ...]:
    """Every ledger a ``/schemas/<id>`` value's versions are stored in, ascending. Raises
    :class:`CorruptPulsarMetadata`."""
    locator = _parse(key, SchemaLocator, data, "SchemaLocator")
    return tuple(sorted({e.position.ledgerId for e in (locator.info, *locator.index)}))
