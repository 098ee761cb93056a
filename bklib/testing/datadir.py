"""Offline faults for a stopped Python bookie's data dir: list, read, delete and corrupt
stored entries. Tests and the demo use these to make a bookie lose or damage data; the bookie
itself never does (a running bookie's faults go through :mod:`bklib.bookie.faults`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from bklib.bookie import journal as jr
from bklib.bookie.storage import DirLock, journal_dir, load_index
from bklib.errors import NoSuchEntryError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    lock = DirLock(data_dir)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def stored_entries(data_dir: str | Path) -> dict[int, list[int]]:
    """``{ledgerId: sorted entry ids}`` stored in a stopped bookie's data dir."""
    with _locked(Path(data_dir)):
        ledgers = load_index(Path(data_dir), repair_tail=False)
    return {lid: sorted(s.entries) for lid, s in ledgers.items()}


def read_stored_entry(data_dir: str | Path, ledger_id: int, entry_id: int) -> bytes:
    """The stored body of one entry in a stopped bookie's data dir."""
    data_dir = Path(data_dir)
    with _locked(data_dir):
        ledgers = load_index(data_dir, repair_tail=False)
        state = ledgers.get(ledger_id)
        loc = None if state is None else state.entries.get(entry_id)
        if loc is None:
            raise NoSuchEntryError(ledger_id=ledger_id, entry_id=entry_id)
        file_no, offset, length = jr.unpack_loc(loc)
        with open(journal_dir(data_dir) / jr.file_name(file_no), "rb") as f:
            f.seek(offset)
            return f.read(length)


def delete_entries(data_dir: str | Path, ledger_id: int, entry_ids: Iterable[int]) -> list[int]:
    """Make a stopped bookie lose entries: appends durable tombstones, so after restart its
    index has no record of them and reads answer ENOENTRY. Returns the ids that existed."""
    data_dir = Path(data_dir)
    wanted = list(entry_ids)
    with _locked(data_dir):
        # Repairing the torn tail first keeps the old newest file valid once a newer file
        # follows it (replay refuses invalid records in older files).
        ledgers = load_index(data_dir, repair_tail=True)
        state = ledgers.get(ledger_id)
        present = [] if state is None else [e for e in wanted if e in state.entries]
        if present:
            jdir = journal_dir(data_dir)
            files = jr.list_files(jdir)
            next_no = files[-1][0] + 1 if files else 1
            jr.write_file(
                jdir,
                next_no,
                [jr.encode_record(jr.REC_DELETE_ENTRY, ledger_id, e, b"") for e in present],
            )
    log.warning("data dir %s: ledger %d entries %s deleted", data_dir, ledger_id, present)
    return present


def corrupt_entry(data_dir: str | Path, ledger_id: int, entry_id: int, offset: int = -1) -> None:
    """Flip one byte (XOR 0xFF at ``offset`` of the body, default its last byte, i.e. the
    payload or digest) of an entry in a stopped bookie's data dir. The bookie will serve the
    changed bytes; a reader's digest check fails."""
    data_dir = Path(data_dir)
    with _locked(data_dir):
        ledgers = load_index(data_dir, repair_tail=True)
        state = ledgers.get(ledger_id)
        loc = None if state is None else state.entries.get(entry_id)
        if loc is None:
            raise NoSuchEntryError(ledger_id=ledger_id, entry_id=entry_id)
        file_no, off, length = jr.unpack_loc(loc)
        with open(journal_dir(data_dir) / jr.file_name(file_no), "rb") as f:
            f.seek(off)
            body = bytearray(f.read(length))
        body[offset] ^= 0xFF
        jr.patch_record_payload(journal_dir(data_dir), loc, bytes(body))
    log.warning(
        "data dir %s: ledger %d entry %d corrupted at offset %d",
        data_dir,
        ledger_id,
        entry_id,
        offset,
    )
