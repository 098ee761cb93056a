"""Which ledgers name each bookie, kept current from per-ledger metadata changes.

A lost bookie matters to the ledgers whose ensembles name it: any segment, any state. The watch
keeps that answer in a :class:`BookieIndex` fed by every metadata change (:meth:`apply`), so a
loss costs a lookup instead of a full metadata scan; a periodic scan reconciles it
(:meth:`diff_scan`, or :meth:`diff` against an index built with :meth:`from_scan`). Pure
logic, no I/O; not thread-safe (one owner applies and asks).

Memory, at a million ledgers on 100 bookies (``bench/bookie_index_memory.py``):

- Bookie ids are numbered (a string -> small int table). A number is recycled once no ledger
  names its bookie, so the numbers stay below the count of bookies named at once however many
  bookie ids a long-running watch sees come and go.
- Each ledger is one dict entry, ledger id -> its sorted bookie numbers packed 2 bytes each in
  a ``bytes`` (a 40-byte object for 3 bookies, where a tuple of ints is 64 and a frozenset of
  names over 200). The encoding is canonical, so equal sets compare equal without decoding. A
  dict keeps :meth:`apply` O(1) with no periodic rebuild; a sorted-array store would be
  smaller but stall the watch while merging its changes. Numbers from 2**16 up (65,536
  bookies named at once) fall back to a tuple.
- Each bookie's ledgers are an ``array('I')`` (``'q'`` once a ledger id passes 2**32), with
  lazy deletion: a ledger leaving a bookie only decrements a live count, and the array is
  filtered when its stale entries outnumber the live ones (so at most twice its live size,
  and O(1) amortized per change) or when asked for. ``pyroaring`` would be smaller still but
  is not a dependency.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bklib.errors import IncorrectParameterError

if TYPE_CHECKING:
    from bklib.meta.scan import ScanResult

__all__ = ["BookieIndex", "LedgerDifference"]

_MAX_LEDGER_ID = (1 << 63) - 1  # a Java long
_MAX_NARROW_LEDGER_ID = (1 << 32) - 1  # what a posting array of typecode 'I' holds
_NARROW = 1 << 16  # bookie numbers below this pack into 2 bytes

_Encoded = bytes | tuple[int, ...]


class NamesBookies(Protocol):
    """A ledger's metadata as the index reads it: its id and every bookie any segment names
    (:class:`~bklib.meta.model.LedgerMetadata`, :class:`~bklib.audit.model.LedgerView`)."""

    @property
    def ledger_id(self) -> int: ...

    def bookies(self) -> Iterable[str]: ...


def _encode(numbers: list[int]) -> _Encoded:
    """Sorted bookie numbers in their canonical form: one encoding per set."""
    if not numbers or numbers[-1] < _NARROW:
        return array("H", numbers).tobytes()
    return tuple(numbers)


def _decode(encoded: _Encoded) -> Sequence[int]:
    if type(encoded) is bytes:
        return array("H", encoded)
    return encoded


def _posting(ledger_ids: list[int]) -> array[int]:
    """A bookie's sorted ledger ids in the narrowest array that holds them."""
    if not ledger_ids or ledger_ids[-1] <= _MAX_NARROW_LEDGER_ID:
        return array("I", ledger_ids)
    return array("q", ledger_ids)


def _check_ledger_id(ledger_id: int) -> None:
    if not 0 <= ledger_id <= _MAX_LEDGER_ID:
        raise IncorrectParameterError(f"ledger id {ledger_id} is not a non-negative long")


@dataclass(frozen=True, slots=True)
class LedgerDifference:
    """A ledger whose bookies two indexes disagree on; None where an index lacks the ledger."""

    ledger_id: int
    ours: frozenset[str] | None
    theirs: frozenset[str] | None


class BookieIndex:
    """Bookie id -> the ledgers whose ensembles name it, and ledger id -> its bookies."""

    __slots__ = (
        "_free",
        "_ledgers",
        "_live",
        "_names",
        "_numbers",
        "_object_bytes",
        "_postings",
        "_sorted_len",
    )

    def __init__(self) -> None:
        self._ledgers: dict[int, _Encoded] = {}
        self._numbers: dict[str, int] = {}
        self._names: list[str] = []  # by number; a free number keeps its last name
        self._free: list[int] = []
        self._postings: list[array[int]] = []
        self._live: list[int] = []  # ledgers naming the bookie; the rest of its posting is stale
        self._sorted_len: list[int] = []  # the posting's length when last compacted
        self._object_bytes = 0  # the ledger dict's keys and values, for memory_bytes

    @classmethod
    def from_scan(
        cls, results: Iterable[ScanResult], errors: list[ScanResult] | None = None
    ) -> BookieIndex:
        """An index of the ledgers of a metadata scan (:mod:`bklib.meta.scan`).

        A result without metadata (unreadable or corrupt) names no bookies the index could
        hold. It raises its error, so an index never silently leaves a ledger out, unless
        ``errors`` is given: then it is appended there and the build goes on.
        """
        index = cls()
        for r in results:
            if r.metadata is not None:
                index.apply(r.ledger_id, r.metadata)
            elif errors is not None:
                errors.append(r)
            elif r.error is not None:
                raise r.error
            else:
                raise IncorrectParameterError("scan result without metadata", ledger_id=r.ledger_id)
        return index

    # ---- changes ---------------------------------------------------------------------------

    def apply(self, ledger_id: int, metadata: NamesBookies | None) -> bool:
        """Make the index hold ``metadata``'s bookies for ``ledger_id``, replacing what it held;
        None is a deleted ledger. Idempotent. True if the ledger's bookies changed."""
        _check_ledger_id(ledger_id)
        if metadata is not None and metadata.ledger_id != ledger_id:
            raise IncorrectParameterError(
                f"metadata of ledger {metadata.ledger_id} applied as {ledger_id}",
                ledger_id=ledger_id,
            )
        old = self._ledgers.get(ledger_id)
        if metadata is None:
            if old is None:
                return False
            del self._ledgers[ledger_id]
            self._object_bytes -= sys.getsizeof(ledger_id) + sys.getsizeof(old)
            for number in _decode(old):
                self._unlink(number)
            return True
        # Numbering the names first is safe: a name new to the index makes the set differ.
        numbers = sorted(map(self._number, metadata.bookies()))
        new = _encode(numbers)
        if new == old:
            return False
        self._ledgers[ledger_id] = new
        self._object_bytes += sys.getsizeof(new)
        if old is None:  # most changes: a new ledger
            self._object_bytes += sys.getsizeof(ledger_id)
            for number in numbers:
                self._link(number, ledger_id)
            return True
        self._object_bytes -= sys.getsizeof(old)
        old_numbers = _decode(old)
        for number in set(numbers).difference(old_numbers):
            self._link(number, ledger_id)
        for number in set(old_numbers).difference(numbers):
            self._unlink(number)
        return True

    def _number(self, name: str) -> int:
        number = self._numbers.get(name)
        if number is not None:
            return number
        if self._free:
            number = self._free.pop()
            self._names[number] = name
        else:
            number = len(self._names)
            self._names.append(name)
            self._postings.append(array("I"))
            self._live.append(0)
            self._sorted_len.append(0)
        self._numbers[name] = number
        return number

    def _link(self, number: int, ledger_id: int) -> None:
        posting = self._postings[number]
        if ledger_id > _MAX_NARROW_LEDGER_ID and posting.typecode == "I":
            posting = self._postings[number] = array("q", posting)
        posting.append(ledger_id)
        self._live[number] += 1

    def _unlink(self, number: int) -> None:
        # The ledger id stays in the posting (lazy deletion) until stale entries outnumber
        # live ones: each compaction is paid for by as many unlinks as it keeps entries.
        live = self._live[number] = self._live[number] - 1
        if len(self._postings[number]) - live > live:
            self._compact(number)

    def _compact(self, number: int) -> None:
        """Filter the bookie's posting down to its live ledgers, sorted and unique (a ledger
        that left the bookie and came back is in it twice); free the number if none is left."""
        ledgers = self._ledgers
        kept = sorted(
            {lid for lid in self._postings[number] if number in _decode(ledgers.get(lid, b""))}
        )
        if kept:
            self._postings[number] = _posting(kept)
            self._sorted_len[number] = len(kept)
            return
        del self._numbers[self._names[number]]
        self._postings[number] = array("I")
        self._sorted_len[number] = 0
        self._free.append(number)

    # ---- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """The number of ledgers held."""
        return len(self._ledgers)

    def __contains__(self, ledger_id: object) -> bool:
        return ledger_id in self._ledgers

    @property
    def bookie_count(self) -> int:
        """The number of bookies some held ledger names."""
        return len(self._numbers)

    def bookies(self) -> frozenset[str]:
        """Every bookie some held ledger names."""
        return frozenset(self._numbers)

    def ledgers_of(self, bookie_id: str) -> list[int]:
        """The ids of the ledgers naming ``bookie_id`` in any segment, ascending."""
        number = self._numbers.get(bookie_id)
        if number is None:
            return []
        posting = self._postings[number]
        if len(posting) != self._live[number] or len(posting) != self._sorted_len[number]:
            self._compact(number)  # stale entries, or appended since the last sort
            posting = self._postings[number]
        return posting.tolist()

    def ledgers_of_any(self, bookie_ids: Iterable[str]) -> list[int]:
        """The ids of the ledgers naming any of ``bookie_ids``, ascending and unique."""
        found: set[int] = set()
        for bookie_id in bookie_ids:
            found.update(self.ledgers_of(bookie_id))
        return sorted(found)

    def bookies_of(self, ledger_id: int) -> frozenset[str] | None:
        """The bookies ``ledger_id``'s ensembles name, or None if the index lacks the ledger."""
        encoded = self._ledgers.get(ledger_id)
        return None if encoded is None else self._names_of(encoded)

    def _names_of(self, encoded: _Encoded) -> frozenset[str]:
        names = self._names
        return frozenset(names[n] for n in _decode(encoded))

    def diff(self, other: BookieIndex) -> list[LedgerDifference]:
        """The ledgers whose bookies differ between this index (``ours``) and ``other``
        (``theirs``), a ledger only one holds included; by ledger id."""
        # Other's numbers in ours (-1: a bookie we do not know). Where every bookie has the
        # same number in both, the canonical encodings compare as they are.
        ours_of = [self._numbers.get(name, -1) for name in other._names]
        same = all(self._numbers.get(name) == n for name, n in other._numbers.items())
        theirs_all = other._ledgers
        out: list[LedgerDifference] = []
        for lid, mine in self._ledgers.items():
            theirs = theirs_all.get(lid)
            if theirs is None:
                out.append(LedgerDifference(lid, self._names_of(mine), None))
            elif (mine != theirs) if same else self._differs(mine, theirs, ours_of):
                out.append(LedgerDifference(lid, self._names_of(mine), other._names_of(theirs)))
        for lid, theirs in theirs_all.items():
            if lid not in self._ledgers:
                out.append(LedgerDifference(lid, None, other._names_of(theirs)))
        out.sort(key=lambda d: d.ledger_id)
        return out

    def diff_scan(self, ledgers: Iterable[NamesBookies]) -> list[LedgerDifference]:
        """As :meth:`diff` against an index of ``ledgers`` (a full scan's, each ledger once),
        compared as they stream: no second index is built. At a million ledgers one is 122 MB,
        which a reconciliation would hold beside the scan's own tables and this index."""
        mine_all, numbers = self._ledgers, self._numbers
        out: list[LedgerDifference] = []
        matched = array("q")  # the scanned ids this index holds: 8 bytes a ledger
        for v in ledgers:
            lid = v.ledger_id
            names = frozenset(v.bookies())
            mine = mine_all.get(lid)
            if mine is None:
                out.append(LedgerDifference(lid, None, names))
                continue
            matched.append(lid)
            ours = [numbers.get(name, -1) for name in names]  # -1: a bookie we do not hold
            if -1 in ours or _encode(sorted(ours)) != mine:
                out.append(LedgerDifference(lid, self._names_of(mine), names))
        if len(matched) != len(mine_all):  # some ledger held here was not in the scan
            scanned = set(matched)
            out.extend(
                LedgerDifference(lid, self._names_of(mine), None)
                for lid, mine in mine_all.items()
                if lid not in scanned
            )
        out.sort(key=lambda d: d.ledger_id)
        return out

    @staticmethod
    def _differs(mine: _Encoded, theirs: _Encoded, ours_of: list[int]) -> bool:
        translated = sorted(ours_of[n] for n in _decode(theirs))
        return list(_decode(mine)) != translated

    def memory_bytes(self) -> int:
        """An estimate of the heap the index holds (object sizes, without the allocator's
        rounding); O(bookies), cheap enough for a metric."""
        total = sys.getsizeof(self._ledgers) + self._object_bytes
        total += sum(map(sys.getsizeof, self._postings))
        total += sys.getsizeof(self._numbers) + sum(map(sys.getsizeof, self._numbers))
        for per_bookie in (self._names, self._free, self._live, self._sorted_len):
            total += sys.getsizeof(per_bookie)
        return total
