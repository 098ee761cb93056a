"""The bookie's append-only journal: numbered log files, group commit, replay, rotation.

The Python bookie keeps everything in the journal: entries, master keys, fences, explicit
LACs and test tombstones. The journal *is* the entry log; ``storage.py`` keeps an in-memory
index of where each entry's bytes live (rebuilt by replaying the journal on start), so
there is no second copy of the data to keep consistent with the first.

File layout, in ``<dir>/<file_no as 16 hex digits>.log``:

* a 16-byte file header: ``b"BKAJRNL1"`` then the file number (int64 BE);
* records, each ``crc32c:u32 | length:u32 | type:u8 | ledgerId:i64 | entryId:i64 | payload``.
  ``length`` counts from ``type`` to the end of the payload; the CRC-32C covers ``length``
  through the end of the payload.

Group commit: :meth:`Journal.append` only copies the record into an in-memory batch and
returns a *location* right away (the bytes can be read back from then on). One flush at a
time writes the whole batch with a single ``write`` and then runs ``fdatasync`` in a worker
thread; records appended meanwhile form the next batch. Callbacks registered with
:meth:`Journal.when_durable` run on the event loop after the fsync that covers their batch.
So a bookie acknowledges an add only after it is on disk, while paying one fsync per batch.

Crash safety: fsyncs cover a prefix of the log, so after a crash only the tail of the newest
file can be torn, and nothing in it was ever acknowledged. Replay truncates the newest file
at its first invalid record. Rotation fsyncs a file completely before the first byte of the
next one is written, so an invalid record in any older file is real corruption: replay
refuses (:class:`CorruptJournalError`) instead of silently dropping acknowledged data.
Every start writes into a new file, so files are never appended to after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from bklib.durable import fsync_dir
from bklib.errors import BKError

log = logging.getLogger(__name__)

FILE_MAGIC = b"BKAJRNL1"
FILE_HEADER = struct.Struct(">8sq")
FILE_HEADER_LEN = FILE_HEADER.size  # 16

_CRC = struct.Struct(">I")
# length, type, ledgerId, entryId: what follows the CRC in every record.
_REC_REST = struct.Struct(">IBqq")
RECORD_HEADER_LEN = _CRC.size + _REC_REST.size  # 25
_REC_FIXED = _REC_REST.size - 4  # type + ids: the part of ``length`` that is not payload

# Record types.
REC_ENTRY = 1
REC_MASTER_KEY = 2
REC_FENCE = 3
REC_EXPLICIT_LAC = 4
REC_DELETE_ENTRY = 5  # tombstone written only by the test helpers in storage.py
REC_TYPES = frozenset({REC_ENTRY, REC_MASTER_KEY, REC_FENCE, REC_EXPLICIT_LAC, REC_DELETE_ENTRY})

# A location packs (file_no, payload offset, payload length) into one int so the index costs
# one small int per entry: offset < 2**32 and length < 2**24 are enforced on append.
_OFF_SHIFT = 24
_FILE_SHIFT = 56
MAX_PAYLOAD = (1 << _OFF_SHIFT) - 1
MAX_FILE_SIZE_LIMIT = 1 << 32
DEFAULT_FILE_SIZE = 64 * 1024 * 1024


def pack_loc(file_no: int, offset: int, length: int) -> int:
    """Pack a payload position into the int stored in the index."""
    return (file_no << _FILE_SHIFT) | (offset << _OFF_SHIFT) | length


def unpack_loc(loc: int) -> tuple[int, int, int]:
    """``(file_no, payload offset, payload length)`` of a packed location."""
    return loc >> _FILE_SHIFT, (loc >> _OFF_SHIFT) & 0xFFFFFFFF, loc & MAX_PAYLOAD


class JournalError(BKError):
    """The journal cannot be written or read (disk error, missing file); maps to EIO."""


class CorruptJournalError(JournalError):
    """A record that was once made durable no longer checks out: refuse to start rather than
    forget acknowledged entries."""


def file_name(file_no: int) -> str:
    return f"{file_no:016x}.log"


def list_files(directory: Path) -> list[tuple[int, Path]]:
    """Journal files in ``directory``, oldest first."""
    out = []
    if directory.is_dir():
        for p in directory.iterdir():
            if p.suffix == ".log" and len(p.stem) == 16:
                try:
                    out.append((int(p.stem, 16), p))
                except ValueError:
                    continue
    out.sort()
    return out


def encode_record(rtype: int, ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    """One complete record (for offline writers; the hot path inlines this)."""
    rest = _REC_REST.pack(_REC_FIXED + len(payload), rtype, ledger_id, entry_id)
    return _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(rest))) + rest + payload


@dataclass(frozen=True, slots=True)
class Record:
    """One replayed record. ``payload`` is a view into the file's bytes: copy what you keep."""

    rtype: int
    ledger_id: int
    entry_id: int
    loc: int
    payload: memoryview


def _scan(data: bytes, file_no: int) -> tuple[list[Record], int]:
    """Parse a whole file. Returns the valid records and the offset where validity ends."""
    size = len(data)
    if size == 0:
        return [], 0
    if size < FILE_HEADER_LEN:
        return [], 0
    magic, no = FILE_HEADER.unpack_from(data, 0)
    if magic != FILE_MAGIC or no != file_no:
        return [], 0
    view = memoryview(data)
    records: list[Record] = []
    pos = FILE_HEADER_LEN
    crc_fn = crc32c.crc32c
    unpack_crc = _CRC.unpack_from
    unpack_rest = _REC_REST.unpack_from
    while size - pos >= RECORD_HEADER_LEN:
        (crc,) = unpack_crc(data, pos)
        length, rtype, ledger_id, entry_id = unpack_rest(data, pos + 4)
        end = pos + 8 + length
        if length < _REC_FIXED or end > size or rtype not in REC_TYPES:
            break
        if crc_fn(view[pos + 4 : end]) != crc:
            break
        start = pos + RECORD_HEADER_LEN
        records.append(
            Record(
                rtype, ledger_id, entry_id, pack_loc(file_no, start, end - start), view[start:end]
            )
        )
        pos = end
    return records, pos


def replay(directory: Path, *, repair_tail: bool = True) -> Iterator[Record]:
    """Yield every valid record of every journal file, oldest first.

    The newest file's torn tail (anything after its first invalid record) is truncated when
    ``repair_tail``; an invalid record in an older file raises CorruptJournalError.
    """
    files = list_files(directory)
    for i, (file_no, path) in enumerate(files):
        newest = i == len(files) - 1
        data = path.read_bytes()
        records, valid_end = _scan(data, file_no)
        if valid_end != len(data):
            if not newest:
                raise CorruptJournalError(
                    f"journal file {path} is invalid at offset {valid_end} of {len(data)}; "
                    "acknowledged entries may be damaged, refusing to continue"
                )
            log.warning(
                "journal %s: truncating torn tail at offset %d (%d bytes were never synced)",
                path,
                valid_end,
                len(data) - valid_end,
            )
            if repair_tail:
                with open(path, "r+b") as f:
                    f.truncate(valid_end)
                    f.flush()
                    os.fsync(f.fileno())
        yield from records


def write_file(directory: Path, file_no: int, records: list[bytes]) -> None:
    """Write a complete new journal file durably (offline tools: tombstones)."""
    path = directory / file_name(file_no)
    with open(path, "xb") as f:
        f.write(FILE_HEADER.pack(FILE_MAGIC, file_no))
        for rec in records:
            f.write(rec)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)


def patch_record_payload(directory: Path, loc: int, new_payload: bytes) -> None:
    """Overwrite a record's payload in place (same length) and fix its CRC (test helper).

    Simulates corruption the storage layer cannot see, as in BookKeeper's entry logs which
    carry no checksum: the bookie will serve the changed bytes.
    """
    file_no, offset, length = unpack_loc(loc)
    if len(new_payload) != length:
        raise ValueError("payload length must not change")
    path = directory / file_name(file_no)
    with open(path, "r+b") as f:
        start = offset - RECORD_HEADER_LEN
        f.seek(start + 4)
        rest = f.read(_REC_REST.size)
        f.seek(offset)
        f.write(new_payload)
        f.seek(start)
        f.write(_CRC.pack(crc32c.crc32c(new_payload, crc32c.crc32c(rest))))
        f.flush()
        os.fsync(f.fileno())


@dataclass(slots=True)
class _Batch:
    """Records waiting for one write+fsync. A batch never spans two files."""

    seq: int
    file_no: int
    base: int  # file offset where buf[0] lands
    buf: bytearray = field(default_factory=bytearray)
    new_file: bool = False
    barrier: bool = False  # a sync was requested even if buf is empty


def _sync_fds(fd: int, dir_fd: int | None) -> None:
    # fdatasync also persists the size change of an append, which is all we need.
    os.fdatasync(fd)
    if dir_fd is not None:
        os.fsync(dir_fd)


class Journal:
    """An open journal: appends with group commit, reads by location.

    Create it after :func:`replay` has run over the directory (:meth:`open` does not replay).
    Everything except the fsync runs on the event loop thread; the class is not thread-safe.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_file_size: int = DEFAULT_FILE_SIZE,
        name: str = "bookie",
    ) -> None:
        if not FILE_HEADER_LEN < max_file_size < MAX_FILE_SIZE_LIMIT:
            raise ValueError(f"max_file_size must be below {MAX_FILE_SIZE_LIMIT}")
        self.directory = Path(directory)
        self.max_file_size = max_file_size
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fsync-{name}")
        self._dir_fd: int | None = None
        self._wfd: int | None = None
        self._wfile = -1
        self._rfds: dict[int, int] = {}
        self._batches: list[_Batch] = []
        self._end = 0  # logical end of the newest file, including unwritten batches
        self._next_seq = 1
        self.synced_seq = 0
        self._waiters: dict[int, list[Callable[[BaseException | None], None]]] = {}
        self._flush_scheduled = False
        self._in_flight = False
        self._failed: BaseException | None = None
        self._closed = False
        self.bytes_pending = 0

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Start a new file after the newest existing one. Call on the event loop."""
        self._loop = asyncio.get_running_loop()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._dir_fd = os.open(self.directory, os.O_RDONLY)
        files = list_files(self.directory)
        next_no = files[-1][0] + 1 if files else 1
        self._start_file(next_no)

    async def close(self) -> None:
        """Flush and sync everything appended so far, then release the files."""
        if self._closed:
            return
        if self._failed is None and self._loop is not None:
            fut: asyncio.Future[BaseException | None] = self._loop.create_future()
            self.when_durable(self.request_sync(), functools.partial(_settle, fut))
            await fut
        self._closed = True
        for fd in [self._wfd, self._dir_fd, *self._rfds.values()]:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wfd = self._dir_fd = None
        self._rfds.clear()
        self._executor.shutdown(wait=True)

    @property
    def is_open(self) -> bool:
        return self._loop is not None and not self._closed

    @property
    def failed(self) -> BaseException | None:
        """The error that stopped the journal, if any; appends then raise JournalError."""
        return self._failed

    # -- appends ---------------------------------------------------------------------------

    def _start_file(self, file_no: int) -> None:
        batch = _Batch(self._next_seq, file_no, 0, bytearray(), new_file=True)
        self._next_seq += 1
        batch.buf += FILE_HEADER.pack(FILE_MAGIC, file_no)
        self._batches.append(batch)
        self._end = FILE_HEADER_LEN
        self.bytes_pending += FILE_HEADER_LEN

    def append(self, rtype: int, ledger_id: int, entry_id: int, payload: bytes) -> int:
        """Queue one record; returns the location of its payload. Durable only once the
        batch :attr:`pending_seq` has synced."""
        if self._failed is not None:
            raise JournalError(f"journal failed: {self._failed}", ledger_id=ledger_id)
        n = len(payload)
        if n > MAX_PAYLOAD:
            raise JournalError(f"record payload of {n} bytes too large", ledger_id=ledger_id)
        size = RECORD_HEADER_LEN + n
        if self._end + size > self.max_file_size and self._end > FILE_HEADER_LEN:
            self._start_file(self._batches[-1].file_no + 1 if self._batches else self._wfile + 1)
        batch = self._batches[-1] if self._batches else self._new_batch()
        rest = _REC_REST.pack(_REC_FIXED + n, rtype, ledger_id, entry_id)
        buf = batch.buf
        buf += _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(rest)))
        buf += rest
        buf += payload
        start = self._end + RECORD_HEADER_LEN
        self._end += size
        self.bytes_pending += size
        self._kick()
        return (batch.file_no << _FILE_SHIFT) | (start << _OFF_SHIFT) | n

    def _new_batch(self) -> _Batch:
        batch = _Batch(self._next_seq, self._wfile, self._end)
        self._next_seq += 1
        self._batches.append(batch)
        return batch

    @property
    def pending_seq(self) -> int:
        """The batch the next/last appended record belongs to."""
        return self._batches[-1].seq if self._batches else self._next_seq

    def request_sync(self) -> int:
        """Ask for an fsync covering everything appended so far; returns the batch to wait
        for (FORCE_LEDGER)."""
        if not self._batches:
            if not self._in_flight:
                # Nothing written since the last completed fsync.
                return self.synced_seq
            self._new_batch()
        self._batches[-1].barrier = True
        self._kick()
        return self._batches[-1].seq

    def when_durable(self, seq: int, callback: Callable[[BaseException | None], None]) -> None:
        """Run ``callback(None)`` once batch ``seq`` is fsynced, or ``callback(exc)`` if its
        write failed. Runs soon if it already is."""
        if seq <= self.synced_seq:
            assert self._loop is not None
            self._loop.call_soon(callback, None)
        elif self._failed is not None:
            assert self._loop is not None
            self._loop.call_soon(callback, self._failed)
        else:
            self._waiters.setdefault(seq, []).append(callback)

    def is_durable(self, seq: int) -> bool:
        return seq <= self.synced_seq

    async def wait_durable(self, seq: int) -> None:
        """Wait until batch ``seq`` is fsynced; raises JournalError if that failed."""
        if seq <= self.synced_seq:
            return
        assert self._loop is not None
        fut: asyncio.Future[BaseException | None] = self._loop.create_future()
        self.when_durable(seq, functools.partial(_settle, fut))
        exc = await fut
        if exc is not None:
            raise JournalError(f"journal write failed: {exc}")

    async def drain(self) -> None:
        """Wait until nothing is pending or in flight (tests and shutdown)."""
        await self.wait_durable(self.request_sync())

    # -- flushing --------------------------------------------------------------------------

    def _kick(self) -> None:
        if not self._flush_scheduled and not self._in_flight:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._in_flight or not self._batches or self._failed is not None:
            return
        # Take every leading batch of the same file: they go out in one write and one fsync.
        # A later file waits for the next round so each file is synced completely before the
        # next one receives a byte (see the module docstring on corruption detection).
        first = self._batches[0]
        take = 1
        while take < len(self._batches) and self._batches[take].file_no == first.file_no:
            take += 1
        batches = self._batches[:take]
        del self._batches[:take]
        last_seq = batches[-1].seq
        new_file = any(b.new_file for b in batches)
        try:
            if new_file:
                self._open_write(first.file_no)
            assert self._wfd is not None
            data = batches[0].buf if take == 1 else b"".join(b.buf for b in batches)
            view = memoryview(data)
            while view:
                n = os.write(self._wfd, view)
                view = view[n:]
            view.release()
        except OSError as exc:
            self._fail(exc, last_seq)
            return
        self.bytes_pending -= len(data)
        self._in_flight = True
        assert self._loop is not None
        fut = self._loop.run_in_executor(
            self._executor, _sync_fds, self._wfd, self._dir_fd if new_file else None
        )
        fut.add_done_callback(lambda f: self._synced(last_seq, f))

    def _open_write(self, file_no: int) -> None:
        if self._wfd is not None:
            os.close(self._wfd)
            self._wfd = None
        path = self.directory / file_name(file_no)
        self._wfd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._wfile = file_no
        log.info("journal %s: writing %s", self.name, path)

    def _synced(self, seq: int, fut: asyncio.Future[None]) -> None:
        self._in_flight = False
        exc = fut.exception()
        if exc is not None:
            self._fail(exc, seq)
            return
        self.synced_seq = seq
        ready = [s for s in self._waiters if s <= seq]
        ready.sort()
        for s in ready:
            for cb in self._waiters.pop(s):
                try:
                    cb(None)
                except Exception:
                    log.exception("journal %s: durability callback failed", self.name)
        if self._batches:
            self._flush()

    def _fail(self, exc: BaseException, seq: int) -> None:
        # After a failed write the file may hold a partial record: stop writing altogether.
        log.error("journal %s: write/fsync failed at batch %d: %s", self.name, seq, exc)
        self._failed = exc
        self._in_flight = False
        waiters, self._waiters = self._waiters, {}
        self._batches.clear()
        for cbs in waiters.values():
            for cb in cbs:
                with contextlib.suppress(Exception):
                    cb(exc)

    # -- reads -----------------------------------------------------------------------------

    def read(self, loc: int) -> bytes:
        """The payload at ``loc``, from the unwritten batches or the file. Raises JournalError
        if the bytes cannot be produced (file gone or short)."""
        file_no = loc >> _FILE_SHIFT
        offset = (loc >> _OFF_SHIFT) & 0xFFFFFFFF
        length = loc & MAX_PAYLOAD
        for batch in self._batches:
            if batch.file_no == file_no and offset >= batch.base:
                rel = offset - batch.base
                if rel + length <= len(batch.buf):
                    return bytes(batch.buf[rel : rel + length])
        fd = self._rfds.get(file_no)
        try:
            if fd is None:
                fd = os.open(self.directory / file_name(file_no), os.O_RDONLY)
                self._rfds[file_no] = fd
            data = os.pread(fd, length, offset)
        except OSError as exc:
            raise JournalError(f"cannot read journal file {file_name(file_no)}: {exc}") from exc
        if len(data) != length:
            raise JournalError(
                f"journal file {file_name(file_no)} is short at offset {offset} "
                f"({len(data)} of {length} bytes)"
            )
        return data

    def forget_file(self, file_no: int) -> None:
        """Drop a cached read descriptor (after a file was patched or removed offline)."""
        fd = self._rfds.pop(file_no, None)
        if fd is not None:
            os.close(fd)


def _settle(fut: asyncio.Future[BaseException | None], exc: BaseException | None) -> None:
    # A durability callback may outlive a waiter that was cancelled meanwhile.
    if not fut.done():
        fut.set_result(exc)
