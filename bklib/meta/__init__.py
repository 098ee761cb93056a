"""BookKeeper metadata in ZooKeeper: the ledger metadata model, its serde and the znode formats."""

from bklib.meta.model import DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.serde import decode_metadata, encode_metadata

__all__ = [
    "DigestType",
    "LedgerMetadata",
    "LedgerState",
    "Segment",
    "decode_metadata",
    "encode_metadata",
]
