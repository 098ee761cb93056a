"""Pulsar messages in ledger entries: message ids and publish times (pure).

A broker stores each message (or batch) as one entry of its topic's data ledger
(``Commands.serializeMetadataAndPayload``)::

    [0x0e02, size (4 bytes), BrokerEntryMetadata]   only with brokerEntryMetadataInterceptors
    [0x0e01, CRC32C (4 bytes)]                      only when the producer sent a checksum
    metadata size (4 bytes, big-endian), MessageMetadata, payload

so entry ``E`` of ledger ``L`` is message id ``L:E`` (batches add an index after it). Cursor
ledgers hold cursor positions, not messages: only a data ledger's entries are read this way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from bklib.proto.pulsar_formats_pb2 import MessageMetadata

__all__ = ["format_message_ids", "publish_time"]

MAGIC_BROKER_ENTRY_METADATA = b"\x0e\x02"
MAGIC_CRC32C = b"\x0e\x01"
MAX_IDS = 20


def publish_time(entry: bytes) -> int | None:
    """The publish time (ms since the epoch) of the message in ``entry``, or None when the
    entry is no Pulsar message."""
    pos = 0
    if entry[:2] == MAGIC_BROKER_ENTRY_METADATA:
        if len(entry) < 6:
            return None
        pos = 6 + struct.unpack(">I", entry[2:6])[0]
    if entry[pos : pos + 2] == MAGIC_CRC32C:
        pos += 6
    if len(entry) < pos + 4:
        return None
    (size,) = struct.unpack(">I", entry[pos : pos + 4])
    head = entry[pos + 4 : pos + 4 + size]
    if size == 0 or len(head) < size:
        return None
    md = MessageMetadata()
    try:
        md.ParseFromString(head)
    except DecodeError:
        return None
    return int(md.publish_time) if md.HasField("publish_time") else None


def format_message_ids(ledger_id: int, ranges: Sequence[tuple[int, int]]) -> str:
    """``L:E`` for single entries and ``L:A..L:B`` for runs, at most :data:`MAX_IDS` terms
    (then ``+N more``)."""
    terms = [
        f"{ledger_id}:{a}" if a == b else f"{ledger_id}:{a}..{ledger_id}:{b}" for a, b in ranges
    ]
    if len(terms) > MAX_IDS:
        return ", ".join(terms[:MAX_IDS]) + f", +{len(terms) - MAX_IDS} more"
    return ", ".join(terms)
