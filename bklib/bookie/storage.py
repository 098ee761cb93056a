"""Ledger storage of the Python bookie: per-ledger state and an entry index over the journal.

Data directory layout::

    <data_dir>/LOCK                  flock'ed by the process that owns the directory
    <data_dir>/current/VERSION       the cookie (registration.py)
    <data_dir>/current/journal/*.log the journal = entry log (journal.py)

Per ledger the bookie keeps its master key, the fenced bit, the explicit LAC body, its known
LAC (max of the LAC piggybacked on stored entries and the explicit LAC) and an index
``entryId -> location`` of the stored bytes. All of it is derived from journal records, so
replaying the journal on start rebuilds exactly the state that was made durable, kill -9
included; nothing else has to be kept consistent.

The index is the authority on what exists (docs/safety-rules.md rule 13): an entry the index
knows but whose bytes cannot be read is an I/O error (EIO), never "no such entry".

Test helpers for audit tests (work on a *stopped* bookie's data dir; a live bookie offers the
same through its admin port, see faults.py):

* :func:`delete_entries` makes a bookie lose chosen entries (tombstone records, so the index
  really no longer has them and reads answer ENOENTRY);
* :func:`corrupt_entry` flips a byte of one stored entry (the bookie serves the changed bytes,
  the reader's digest check fails);
* :func:`stored_entries` and :func:`read_stored_entry` inspect what a bookie holds.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
from collections.abc import Iterable
from pathlib import Path

from bklib.bookie import journal as jr
from bklib.bookie.journal import Journal, JournalError
from bklib.errors import BKError, NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError

log = logging.getLogger(__name__)

# Entry ids of meta records, the same values BookKeeper uses for its journal meta-entries;
# only informative here, since records also carry a type.
METAENTRY_MASTER_KEY = -0x1000
METAENTRY_FENCE = -0x2000
METAENTRY_EXPLICIT_LAC = -0x8000

_I64 = struct.Struct(">q")
_IDS = struct.Struct(">qq")
_LAC_AT_16 = struct.Struct(">q")


class StorageError(BKError):
    """The stored bytes of an entry the index knows cannot be produced (maps to EIO)."""


class DataDirLockedError(BKError):
    """Another process (a running bookie) owns the data directory."""


def journal_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "current" / "journal"


class LedgerState:
    """What the bookie knows about one ledger."""

    __slots__ = (
        "entries",
        "explicit_lac",
        "fence_seq",
        "fenced",
        "lac",
        "lac_waiters",
        "ledger_id",
        "master_key",
        "max_entry",
    )

    def __init__(self, ledger_id: int, master_key: bytes | None) -> None:
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.fenced = False
        # Journal batch holding the fence record; 0 once it is known to be durable.
        self.fence_seq = 0
        self.explicit_lac: bytes | None = None
        self.lac = -1
        self.entries: dict[int, int] = {}
        self.max_entry = -1
        self.lac_waiters: list[asyncio.Future[None]] = []

    def note_lac(self, lac: int) -> None:
        """Raise the known LAC and wake long-poll readers."""
        if lac > self.lac:
            self.lac = lac
            if self.lac_waiters:
                waiters, self.lac_waiters = self.lac_waiters, []
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)


def _entry_lac(body: bytes | memoryview) -> int:
    return _LAC_AT_16.unpack_from(body, 16)[0] if len(body) >= 24 else -1


class DirLock:
    """An exclusive flock on ``<data_dir>/LOCK``; released when the process dies, kill -9
    included, so a crashed bookie never leaves a stale lock behind."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "LOCK"
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLockedError(
                f"data directory {self.path.parent} is in use by another process"
            ) from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _apply(ledgers: dict[int, LedgerState], rec: jr.Record) -> None:
    """Apply one replayed record to the index."""
    lid = rec.ledger_id
    state = ledgers.get(lid)
    if state is None:
        state = ledgers[lid] = LedgerState(lid, None)
    rtype = rec.rtype
    if rtype == jr.REC_ENTRY:
        eid = rec.entry_id
        state.entries[eid] = rec.loc
        if eid > state.max_entry:
            state.max_entry = eid
        lac = _entry_lac(rec.payload)
        if lac > state.lac:
            state.lac = lac
    elif rtype == jr.REC_MASTER_KEY:
        state.master_key = bytes(rec.payload)
    elif rtype == jr.REC_FENCE:
        state.fenced = True
    elif rtype == jr.REC_EXPLICIT_LAC:
        body = bytes(rec.payload)
        state.explicit_lac = body
        if len(body) >= 16:
            state.lac = max(state.lac, _I64.unpack_from(body, 8)[0])
    elif rtype == jr.REC_DELETE_ENTRY:
        state.entries.pop(rec.entry_id, None)
        if rec.entry_id == state.max_entry:
            state.max_entry = max(state.entries, default=-1)


def load_index(data_dir: Path, *, repair_tail: bool = True) -> dict[int, LedgerState]:
    """Replay a data dir's journal into ledger states (the caller holds the lock)."""
    ledgers: dict[int, LedgerState] = {}
    for rec in jr.replay(journal_dir(data_dir), repair_tail=repair_tail):
        _apply(ledgers, rec)
    return ledgers


class Storage:
    """The live ledger storage of one bookie. Use from the event loop thread only."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        journal_file_size: int = jr.DEFAULT_FILE_SIZE,
        name: str = "bookie",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.name = name
        self.ledgers: dict[int, LedgerState] = {}
        self._lock = DirLock(self.data_dir)
        self.journal = Journal(
            journal_dir(self.data_dir), max_file_size=journal_file_size, name=name
        )

    def lock(self) -> None:
        """Take the data dir lock (DataDirLockedError if another process has it)."""
        if self._lock.fd is None:
            self._lock.acquire()

    def open(self) -> None:
        """Lock the directory, replay the journal, open a new journal file. Call on the loop."""
        self.lock()
        try:
            self.ledgers = load_index(self.data_dir)
            self.journal.open()
        except BaseException:
            self._lock.release()
            raise
        n_entries = sum(len(s.entries) for s in self.ledgers.values())
        log.info(
            "bookie %s: storage %s has %d ledgers, %d entries",
            self.name,
            self.data_dir,
            len(self.ledgers),
            n_entries,
        )

    async def close(self) -> None:
        """Sync what is pending and release the directory."""
        try:
            if self.journal.is_open:
                await self.journal.close()
        finally:
            self._lock.release()

    # -- writes ----------------------------------------------------------------------------

    def handle(self, ledger_id: int, master_key: bytes) -> LedgerState:
        """The ledger for a keyed operation (add, fence, write-LAC): created with this key if
        unknown, as BookKeeper does; UnauthorizedAccessError if the stored key differs."""
        state = self.ledgers.get(ledger_id)
        if state is not None and state.master_key is not None:
            if state.master_key != master_key:
                raise UnauthorizedAccessError(
                    "master key mismatch", ledger_id=ledger_id, bookie=self.name
                )
            return state
        self.journal.append(jr.REC_MASTER_KEY, ledger_id, METAENTRY_MASTER_KEY, master_key)
        if state is None:
            state = self.ledgers[ledger_id] = LedgerState(ledger_id, master_key)
        else:
            state.master_key = master_key
        return state

    def add_entry(self, state: LedgerState, entry_id: int, body: bytes) -> int:
        """Store an entry (readable at once); returns the journal batch to wait for."""
        journal = self.journal
        state.entries[entry_id] = journal.append(jr.REC_ENTRY, state.ledger_id, entry_id, body)
        if entry_id > state.max_entry:
            state.max_entry = entry_id
        if len(body) >= 24:
            lac = _LAC_AT_16.unpack_from(body, 16)[0]
            if lac > state.lac:
                state.note_lac(lac)
        return journal.pending_seq

    def fence(self, state: LedgerState) -> int:
        """Fence the ledger (idempotent); returns the journal batch that makes it durable
        (possibly one already synced)."""
        if not state.fenced:
            self.journal.append(jr.REC_FENCE, state.ledger_id, METAENTRY_FENCE, b"")
            state.fenced = True
            state.fence_seq = self.journal.pending_seq
            log.info("bookie %s: ledger %d fenced", self.name, state.ledger_id)
        return state.fence_seq

    def set_explicit_lac(self, state: LedgerState, body: bytes) -> int:
        """Store a WRITE_LAC body; the LAC is body[8:16]. Returns the batch to wait for."""
        if len(body) < 16:
            raise ValueError("LAC body shorter than 16 bytes")
        self.journal.append(jr.REC_EXPLICIT_LAC, state.ledger_id, METAENTRY_EXPLICIT_LAC, body)
        state.explicit_lac = body
        state.note_lac(_I64.unpack_from(body, 8)[0])
        return self.journal.pending_seq

    # -- reads -----------------------------------------------------------------------------

    def ledger(self, ledger_id: int) -> LedgerState | None:
        return self.ledgers.get(ledger_id)

    def read(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored body of an entry; entry -1 means the highest stored entry.

        NoSuchLedgerError: the bookie has no such ledger. NoSuchEntryError: the index has no
        record of the entry. StorageError: the index has it but the bytes cannot be read.
        """
        state = self.ledgers.get(ledger_id)
        if state is None:
            raise NoSuchLedgerError(ledger_id=ledger_id, bookie=self.name)
        return self.read_from(state, entry_id)

    def read_from(self, state: LedgerState, entry_id: int) -> bytes:
        """As :meth:`read` for a known ledger."""
        if entry_id == -1:
            entry_id = state.max_entry
        loc = state.entries.get(entry_id)
        if loc is None:
            raise NoSuchEntryError(ledger_id=state.ledger_id, entry_id=entry_id, bookie=self.name)
        try:
            return self.journal.read(loc)
        except JournalError as exc:
            log.error(
                "bookie %s: ledger %d entry %d is indexed but unreadable: %s",
                self.name,
                state.ledger_id,
                entry_id,
                exc,
            )
            raise StorageError(
                f"stored entry unreadable: {exc}",
                ledger_id=state.ledger_id,
                entry_id=entry_id,
                bookie=self.name,
            ) from exc

    def entry_ids(self, ledger_id: int) -> list[int]:
        """Sorted ids of the stored entries; NoSuchLedgerError for an unknown ledger."""
        state = self.ledgers.get(ledger_id)
        if state is None:
            raise NoSuchLedgerError(ledger_id=ledger_id, bookie=self.name)
        return sorted(state.entries)

    # -- test helpers on a live bookie -----------------------------------------------------

    def delete_entries(self, ledger_id: int, entry_ids: Iterable[int]) -> tuple[list[int], int]:
        """Forget entries durably (tombstones). Returns the ids that existed and the batch."""
        state = self.ledgers.get(ledger_id)
        deleted: list[int] = []
        if state is None:
            return deleted, self.journal.synced_seq
        for eid in entry_ids:
            if eid in state.entries:
                self.journal.append(jr.REC_DELETE_ENTRY, ledger_id, eid, b"")
                del state.entries[eid]
                deleted.append(eid)
        if deleted and state.max_entry not in state.entries:
            state.max_entry = max(state.entries, default=-1)
        log.warning("bookie %s: ledger %d entries %s deleted", self.name, ledger_id, deleted)
        return deleted, self.journal.request_sync()

    async def corrupt_entry(self, ledger_id: int, entry_id: int, offset: int = -1) -> None:
        """Flip one byte of a stored entry (XOR 0xFF at ``offset`` within the body)."""
        state = self.ledgers.get(ledger_id)
        loc = None if state is None else state.entries.get(entry_id)
        if loc is None:
            raise NoSuchEntryError(ledger_id=ledger_id, entry_id=entry_id, bookie=self.name)
        await self.journal.drain()  # the bytes must be in the file before we patch it
        body = bytearray(self.journal.read(loc))
        body[offset] ^= 0xFF
        await asyncio.get_running_loop().run_in_executor(
            None, jr.patch_record_payload, self.journal.directory, loc, bytes(body)
        )
        log.warning(
            "bookie %s: ledger %d entry %d corrupted at offset %d",
            self.name,
            ledger_id,
            entry_id,
            offset,
        )
