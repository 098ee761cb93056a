"""Exceptions carrying Apache BookKeeper's client error codes (``BKException.Code``).

Every error names what it is about (ledger, entry, bookie or znode) so an operator reading a
log line or a report row knows where to look.
"""

from __future__ import annotations


class BKError(Exception):
    """Base class. ``code`` is BookKeeper's ``BKException.Code`` value."""

    code: int = -999  # UnexpectedConditionException

    def __init__(
        self,
        message: str = "",
        *,
        ledger_id: int | None = None,
        entry_id: int | None = None,
        bookie: str | None = None,
        path: str | None = None,
    ) -> None:
        self.reason = message or type(self).__name__
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.bookie = bookie
        self.path = path
        parts = [message or type(self).__name__]
        where = []
        if ledger_id is not None:
            where.append(f"ledger {ledger_id}")
        if entry_id is not None:
            where.append(f"entry {entry_id}")
        if bookie is not None:
            where.append(f"bookie {bookie}")
        if path is not None:
            where.append(f"znode {path}")
        if where:
            parts.append(f"({', '.join(where)})")
        super().__init__(" ".join(parts))


class ReadError(BKError):
    code = -1


class DigestMatchError(BKError):
    code = -5


class NotEnoughBookiesError(BKError):
    code = -6


class NoSuchLedgerError(BKError):
    code = -7


class BookieHandleNotAvailableError(BKError):
    code = -8


class ZKError(BKError):
    code = -9


class LedgerRecoveryError(BKError):
    code = -10


class LedgerClosedError(BKError):
    code = -11


class WriteError(BKError):
    code = -12


class NoSuchEntryError(BKError):
    code = -13


class IncorrectParameterError(BKError):
    code = -14


class ProtocolVersionError(BKError):
    code = -16


class MetadataVersionError(BKError):
    """A compare-and-set lost to a concurrent writer (ZooKeeper BADVERSION)."""

    code = -17


class MetaStoreError(BKError):
    code = -18


class ClusterNotFoundError(MetaStoreError):
    """No BookKeeper cluster where one was expected (ledgers root, ``LAYOUT`` or
    ``available/`` missing): usually a wrong chroot or ledgers root."""


class CorruptMetadataError(MetaStoreError):
    """Metadata bytes that BookKeeper's serde would reject, or that break its invariants."""


class ClientClosedError(BKError):
    code = -19


class LedgerExistsError(BKError):
    code = -20


class BKTimeoutError(BKError):
    code = -23


class NoSuchLedgerOnMetadataServerError(BKError):
    code = -25


class IllegalOpError(BKError):
    code = -100


class LedgerFencedError(BKError):
    code = -101


class UnauthorizedAccessError(BKError):
    code = -102


class WriteOnReadOnlyBookieError(BKError):
    code = -104


class TooManyRequestsError(BKError):
    code = -105


class LedgerIdOverflowError(BKError):
    code = -106


class DataUnknownError(BKError):
    """The bookie cannot say whether it holds the data (EUNKNOWNLEDGERSTATE): an unknown reply."""

    code = -107


class ReplicationError(BKError):
    code = -200


class UnexpectedConditionError(BKError):
    code = -999


class CompatibilityError(BKError):
    """A cluster layout this library does not speak (e.g. unknown LAYOUT or UR layout)."""

    code = -18


class IncompleteReadError(BKError):
    """A read of the cluster missed part of what it had to read (an unaccounted scan, keys that
    do not decode): what it did not read is unknown, so nothing may be decided from it."""

    code = -999
