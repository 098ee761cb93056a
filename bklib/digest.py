"""Entry and LAC bodies with BookKeeper 4.17 digests (``DigestManager``, ``MacDigestManager``).

An entry body is ``ledgerId | entryId | lac | length`` (four 8-byte big-endian signed longs,
32 bytes), then a digest of ``D`` bytes, then the user payload. The digest covers the 32-byte
header and then the payload, as one running computation that skips the digest field itself.
A LAC body is ``ledgerId | lac`` (16 bytes) followed by a digest of those 16 bytes.

Everything here is pure: no I/O, no shared mutable state, safe to call from many threads.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import crc32c as _crc32c

from bklib.errors import DigestMatchError, IncorrectParameterError
from bklib.meta.model import DigestType
from bklib.records import frozen_record

__all__ = [
    "LAC_METADATA_LENGTH",
    "METADATA_LENGTH",
    "CRC32CDigestManager",
    "CRC32DigestManager",
    "DigestManager",
    "DummyDigestManager",
    "EntryView",
    "MacDigestManager",
    "digest_length",
    "digest_manager",
    "mac_key",
    "master_key",
    "parse_entry_header",
]

Buffer = bytes | bytearray | memoryview
"""Any contiguous byte buffer accepted as input."""

METADATA_LENGTH = 32
"""Size of the entry header ``ledgerId | entryId | lac | length``."""

LAC_METADATA_LENGTH = 16
"""Size of the LAC body header ``ledgerId | lac``."""

_ENTRY_HEADER = struct.Struct(">qqqq")
_LAC_HEADER = struct.Struct(">qq")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")

_DIGEST_LENGTHS: dict[DigestType, int] = {
    DigestType.CRC32: 8,
    DigestType.HMAC: 20,
    DigestType.CRC32C: 4,
    DigestType.DUMMY: 0,
}


def master_key(password: bytes) -> bytes:
    """The 20-byte ledger master key bookies check on adds, fencing and write-LAC.

    SHA1(b"ledger" + password), for every digest type (an empty password gives SHA1(b"ledger")).
    """
    return hashlib.sha1(b"ledger" + bytes(password)).digest()


def mac_key(password: bytes) -> bytes:
    """The HMAC-SHA1 key of a MAC ledger: SHA1(b"mac" + password)."""
    return hashlib.sha1(b"mac" + bytes(password)).digest()


def digest_length(digest_type: DigestType | int) -> int:
    """Number of digest bytes ``D`` that ``digest_type`` puts in every entry and LAC body."""
    try:
        return _DIGEST_LENGTHS[DigestType(digest_type)]
    except ValueError:
        raise IncorrectParameterError(f"unknown digest type {digest_type!r}") from None


def parse_entry_header(body: Buffer) -> tuple[int, int, int, int]:
    """Return ``(ledger_id, entry_id, lac, length)`` from an entry body without verifying it.

    This is what a bookie needs: it stores bodies byte-identical and never checks digests,
    so it does not even need to know the ledger's digest type.
    Raises IncorrectParameterError if the body is shorter than the 32-byte header.
    """
    if len(body) < METADATA_LENGTH:
        raise IncorrectParameterError(
            f"entry body of {len(body)} bytes is shorter than the {METADATA_LENGTH}-byte header"
        )
    return _ENTRY_HEADER.unpack_from(body, 0)


@dataclass(frozen=True)
class EntryView:
    """A verified entry body. ``payload`` is a zero-copy view into the body that was verified."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: memoryview | bytes


class DigestManager(ABC):
    """Packages and verifies entry and LAC bodies of one ledger with one digest type.

    Use :func:`digest_manager` to build one. Instances hold only immutable state.
    """

    digest_type: ClassVar[DigestType]
    digest_length: ClassVar[int]

    def __init__(self, ledger_id: int) -> None:
        if ledger_id < 0:
            raise IncorrectParameterError(f"negative ledger id {ledger_id}")
        self.ledger_id = ledger_id

    # ---- the one thing each type defines -------------------------------------------------------

    @abstractmethod
    def compute_digest(self, header: Buffer, payload: Buffer = b"") -> bytes:
        """Digest of ``header`` followed by ``payload`` (one running computation)."""

    # ---- entries -------------------------------------------------------------------------------

    def package_entry(self, entry_id: int, lac: int, length: int, payload: Buffer) -> bytes:
        """Build the body a client sends for an add: header | digest | payload.

        ``lac`` is the writer's last-add-confirmed when the add starts (-1 if none) and
        ``length`` is the cumulative ledger length including this payload.
        """
        try:
            header = _ENTRY_HEADER.pack(self.ledger_id, entry_id, lac, length)
        except struct.error as exc:
            raise IncorrectParameterError(
                f"entry header field out of range: {exc}",
                ledger_id=self.ledger_id,
                entry_id=entry_id,
            ) from None
        return b"".join((header, self.compute_digest(header, payload), payload))

    def verify_entry(self, body: Buffer, entry_id: int | None) -> EntryView:
        """Check an entry body read from a bookie and return its fields.

        Checks, in BookKeeper's order: length >= 32 + D, digest, ledger id, and the entry id
        unless ``entry_id`` is None (reads of entry -1 / LAC reads, where the bookie returns
        whichever entry is its last). Any failure raises DigestMatchError naming ledger and entry.
        """
        view = memoryview(body)
        d = self.digest_length
        if view.nbytes < METADATA_LENGTH + d:
            raise DigestMatchError(
                f"entry body of {view.nbytes} bytes is shorter than the minimum "
                f"{METADATA_LENGTH + d} for {self.digest_type.name}",
                ledger_id=self.ledger_id,
                entry_id=entry_id,
            )
        header = view[:METADATA_LENGTH]
        payload = view[METADATA_LENGTH + d :]
        ledger_id, actual_entry, lac, length = _ENTRY_HEADER.unpack_from(view, 0)
        expected = self.compute_digest(header, payload)
        if not hmac.compare_digest(expected, view[METADATA_LENGTH : METADATA_LENGTH + d]):
            raise DigestMatchError(
                f"{self.digest_type.name} digest mismatch",
                ledger_id=self.ledger_id,
                entry_id=actual_entry if entry_id is None else entry_id,
            )
        if ledger_id != self.ledger_id:
            raise DigestMatchError(
                f"entry body carries ledger id {ledger_id}",
                ledger_id=self.ledger_id,
                entry_id=actual_entry if entry_id is None else entry_id,
            )
        if entry_id is not None and actual_entry != entry_id:
            raise DigestMatchError(
                f"entry body carries entry id {actual_entry}",
                ledger_id=self.ledger_id,
                entry_id=entry_id,
            )
        # Without __init__: one per entry a check or a copy verifies (bklib/records.py).
        return frozen_record(
            EntryView,
            {
                "ledger_id": ledger_id,
                "entry_id": actual_entry,
                "lac": lac,
                "length": length,
                "payload": payload,
            },
        )

    # ---- LAC bodies ----------------------------------------------------------------------------

    def package_lac(self, lac: int) -> bytes:
        """Build a WRITE_LAC body: ledgerId | lac | digest of those 16 bytes."""
        try:
            header = _LAC_HEADER.pack(self.ledger_id, lac)
        except struct.error as exc:
            raise IncorrectParameterError(
                f"LAC out of range: {exc}", ledger_id=self.ledger_id
            ) from None
        return header + self.compute_digest(header)

    def verify_lac(self, body: Buffer) -> int:
        """Check a READ_LAC body and return the LAC it carries.

        Like Java, bytes after 16 + D are ignored; shorter bodies, a digest mismatch or a foreign
        ledger id raise DigestMatchError.
        """
        view = memoryview(body)
        d = self.digest_length
        if view.nbytes < LAC_METADATA_LENGTH + d:
            raise DigestMatchError(
                f"LAC body of {view.nbytes} bytes is shorter than the minimum "
                f"{LAC_METADATA_LENGTH + d} for {self.digest_type.name}",
                ledger_id=self.ledger_id,
            )
        expected = self.compute_digest(view[:LAC_METADATA_LENGTH])
        if not hmac.compare_digest(expected, view[LAC_METADATA_LENGTH : LAC_METADATA_LENGTH + d]):
            raise DigestMatchError(
                f"{self.digest_type.name} digest mismatch in LAC body", ledger_id=self.ledger_id
            )
        ledger_id: int
        lac: int
        ledger_id, lac = _LAC_HEADER.unpack_from(view, 0)
        if ledger_id != self.ledger_id:
            raise DigestMatchError(
                f"LAC body carries ledger id {ledger_id}", ledger_id=self.ledger_id
            )
        return lac

    parse_entry_header = staticmethod(parse_entry_header)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ledger_id={self.ledger_id})"


class CRC32DigestManager(DigestManager):
    """java.util.zip.CRC32 (zlib's CRC-32), stored unsigned as an 8-byte big-endian long."""

    digest_type = DigestType.CRC32
    digest_length = 8

    def compute_digest(self, header: Buffer, payload: Buffer = b"") -> bytes:
        """CRC-32 of header then payload, as 8 big-endian bytes (upper 4 always zero)."""
        return _U64.pack(zlib.crc32(payload, zlib.crc32(header)))


class CRC32CDigestManager(DigestManager):
    """CRC-32C (Castagnoli), chained from 0 over header then payload, as a 4-byte BE int."""

    digest_type = DigestType.CRC32C
    digest_length = 4

    def compute_digest(self, header: Buffer, payload: Buffer = b"") -> bytes:
        """CRC-32C of header then payload, as 4 big-endian bytes."""
        crc = _crc32c.crc32c(header)
        if len(payload):
            crc = _crc32c.crc32c(payload, value=crc)
        return _U32.pack(crc)


class MacDigestManager(DigestManager):
    """HMAC-SHA1 keyed with SHA1(b"mac" + password); 20 raw bytes."""

    digest_type = DigestType.HMAC
    digest_length = 20

    def __init__(self, ledger_id: int, password: bytes) -> None:
        super().__init__(ledger_id)
        # Key setup (two SHA-1 block compressions) is done once; each digest copies this state.
        self._keyed = hmac.new(mac_key(password), digestmod=hashlib.sha1)

    def compute_digest(self, header: Buffer, payload: Buffer = b"") -> bytes:
        """HMAC-SHA1 of header then payload."""
        mac = self._keyed.copy()
        mac.update(header)
        mac.update(payload)
        return mac.digest()


class DummyDigestManager(DigestManager):
    """No digest (D = 0): only the length and ledger/entry id checks apply."""

    digest_type = DigestType.DUMMY
    digest_length = 0

    def compute_digest(self, header: Buffer, payload: Buffer = b"") -> bytes:
        """Always empty."""
        return b""


def digest_manager(
    ledger_id: int, digest_type: DigestType | int, password: bytes = b""
) -> DigestManager:
    """The DigestManager for ``ledger_id`` with ``digest_type`` (metadata numbering).

    ``password`` matters only for HMAC; the master key (:func:`master_key`) is separate.
    """
    try:
        dt = DigestType(digest_type)
    except ValueError:
        raise IncorrectParameterError(
            f"unknown digest type {digest_type!r}", ledger_id=ledger_id
        ) from None
    if dt is DigestType.CRC32:
        return CRC32DigestManager(ledger_id)
    if dt is DigestType.CRC32C:
        return CRC32CDigestManager(ledger_id)
    if dt is DigestType.HMAC:
        return MacDigestManager(ledger_id, password)
    return DummyDigestManager(ledger_id)
