"""Bookie status codes (v3 ``StatusCode`` and v2 rc) and their mapping to bklib.errors.

The mapping follows the Java client (``CompletionValue``): specific
statuses get specific exceptions; EIO, EBADREQ and anything unknown become the operation's
generic error (ReadError for reads, WriteError for writes).
"""

from __future__ import annotations

from typing import cast

from bklib.errors import (
    BKError,
    DataUnknownError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolVersionError,
    ReadError,
    TooManyRequestsError,
    UnauthorizedAccessError,
    WriteError,
    WriteOnReadOnlyBookieError,
)
from bklib.proto import protocol_pb2 as pb

EOK = pb.EOK
ENOLEDGER = pb.ENOLEDGER
ENOENTRY = pb.ENOENTRY
EBADREQ = pb.EBADREQ
EIO = pb.EIO
EUA = pb.EUA
EBADVERSION = pb.EBADVERSION
EFENCED = pb.EFENCED
EREADONLY = pb.EREADONLY
ETOOMANYREQUESTS = pb.ETOOMANYREQUESTS
EUNKNOWNLEDGERSTATE = pb.EUNKNOWNLEDGERSTATE

# v2 binary rc <-> v3 StatusCode (BookKeeper's ``BookieProtocol`` error codes).
V2_TO_V3: dict[int, int] = {
    0: EOK,
    1: ENOLEDGER,
    2: ENOENTRY,
    100: EBADREQ,
    101: EIO,
    102: EUA,
    103: EBADVERSION,
    104: EFENCED,
    105: EREADONLY,
    106: ETOOMANYREQUESTS,
    107: EUNKNOWNLEDGERSTATE,
}
V3_TO_V2: dict[int, int] = {v3: v2 for v2, v3 in V2_TO_V3.items()}

_SPECIFIC: dict[int, type[BKError]] = {
    ENOENTRY: NoSuchEntryError,
    ENOLEDGER: NoSuchLedgerError,
    EFENCED: LedgerFencedError,
    EUA: UnauthorizedAccessError,
    EREADONLY: WriteOnReadOnlyBookieError,
    ETOOMANYREQUESTS: TooManyRequestsError,
    EUNKNOWNLEDGERSTATE: DataUnknownError,
    EBADVERSION: ProtocolVersionError,
}

# Operations whose generic failure is a WriteError; every other one is a read.
_WRITE_OPS = frozenset({pb.ADD_ENTRY, pb.WRITE_LAC, pb.FORCE_LEDGER, pb.RANGE_ADD_ENTRY})


def status_code(status: int) -> pb.StatusCode:
    """``status`` typed as a ``StatusCode`` for the generated stubs. Enum values are plain ints at
    run time; assigning one to a message field is what rejects a number outside the enum."""
    return cast("pb.StatusCode", status)


def status_name(status: int) -> str:
    """``"ENOENTRY"`` etc., or ``"status <n>"`` for a number outside the enum."""
    try:
        name: str = pb.StatusCode.Name(status)
        return name
    except ValueError:
        return f"status {status}"


def is_write_op(op: int) -> bool:
    """True for operations whose generic error is WriteError (add, write-LAC, force-ledger)."""
    return op in _WRITE_OPS


def error_for_status(
    status: int,
    op: int,
    *,
    ledger_id: int | None = None,
    entry_id: int | None = None,
    bookie: str | None = None,
) -> BKError:
    """The exception for a non-EOK status of operation ``op`` (an ``OperationType`` value).

    EIO, EBADREQ and unknown statuses map to ReadError or WriteError depending on ``op``.
    Raises ValueError for EOK, which is not an error.
    """
    if status == EOK:
        raise ValueError("EOK is not an error status")
    try:
        op_name = pb.OperationType.Name(op)
    except ValueError:
        op_name = f"operation {op}"
    cls = _SPECIFIC.get(status)
    if cls is None:
        cls = WriteError if is_write_op(op) else ReadError
    return cls(
        f"{op_name} failed: {status_name(status)}",
        ledger_id=ledger_id,
        entry_id=entry_id,
        bookie=bookie,
    )
