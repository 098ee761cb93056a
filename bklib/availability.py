"""BookKeeper's ``availabilityOfEntriesOfLedger`` bytes and the stripe arithmetic over them.

A bookie answers GET_LIST_OF_ENTRIES_OF_LEDGER with the set of entry ids it stores for a ledger,
encoded as (BookKeeper's ``AvailabilityOfEntriesOfLedger``, all big-endian)::

    header (64 bytes): int headerVersion (=0) | int numSequenceGroups | 56 reserved bytes
    numSequenceGroups records of 24 bytes, ascending by firstSequenceStart:
        long firstSequenceStart | long lastSequenceStart | int sequenceSize | int sequencePeriod

A group holds sequences of ``sequenceSize`` consecutive ids starting at first, first + period,
..., last (period 0: a single sequence, first == last). Java's encoder never merges sequences, so
what it emits is one record ``(start, start, runLength, 0)`` per maximal run of consecutive ids.

:class:`EntryRuns` keeps the set as sorted, merged, non-adjacent runs ``[start, end]`` and answers
every question (membership, counts, entries of a bookie's stripe that are missing) with bisect
and per-run arithmetic, never by listing every entry id.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

from bklib.errors import IncorrectParameterError
from bklib.quorum import (
    check_index,
    check_quorum,
    check_range,
    count_in_residues,
    first_last_in_residues,
    iter_residues,
    stripe_residue_tuple,
)

__all__ = [
    "CURRENT_HEADER_VERSION",
    "DEFAULT_MAX_DECODED_RUNS",
    "GROUP_SIZE",
    "HEADER_SIZE",
    "AvailabilityFormatError",
    "EntryRuns",
    "decode",
    "encode",
    "from_entry_ids",
]

HEADER_SIZE = 64
GROUP_SIZE = 24
CURRENT_HEADER_VERSION = 0

DEFAULT_MAX_DECODED_RUNS = 50_000_000
"""Decoding refuses to expand general groups into more runs than this (memory guard)."""

_HEADER = struct.Struct(">ii")
_GROUP = struct.Struct(">qqii")
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1


class AvailabilityFormatError(ValueError):
    """``availabilityOfEntriesOfLedger`` bytes that BookKeeper would not produce or accept."""


class EntryRuns:
    """An immutable set of entry ids held as sorted, merged, non-adjacent runs ``[start, end]``.

    Build it with :meth:`from_entry_ids`, :meth:`from_runs` or :func:`decode`. Memory and the cost
    of every query depend on the number of runs, not on the number of entries.
    """

    __slots__ = ("_cum", "_ends", "_starts")

    _starts: array[int]
    _ends: array[int]
    _cum: array[int]

    def __init__(self, runs: Iterable[tuple[int, int]] = ()) -> None:
        """Build from ``(start, end)`` pairs in any order; overlapping or adjacent runs merge."""
        starts, ends = _merge_runs(runs)
        self._init(starts, ends)

    def _init(self, starts: array[int], ends: array[int]) -> None:
        # Cumulative sizes let count_in answer in O(log runs).
        cum = array("q", [0])
        total = 0
        for s, t in zip(starts, ends, strict=True):
            total += t - s + 1
            cum.append(total)
        object.__setattr__(self, "_starts", starts)
        object.__setattr__(self, "_ends", ends)
        object.__setattr__(self, "_cum", cum)

    @classmethod
    def _from_merged(cls, starts: array[int], ends: array[int]) -> EntryRuns:
        obj = cls.__new__(cls)
        obj._init(starts, ends)
        return obj

    @classmethod
    def from_runs(cls, runs: Iterable[tuple[int, int]]) -> EntryRuns:
        """Build from inclusive ``(start, end)`` pairs in any order."""
        return cls(runs)

    @classmethod
    def from_entry_ids(cls, entry_ids: Iterable[int]) -> EntryRuns:
        """Build from entry ids; ascending input is one linear pass, other input is sorted."""
        starts: array[int] = array("q")
        ends: array[int] = array("q")
        it = iter(entry_ids)
        for x in it:
            if x < 0:
                raise IncorrectParameterError(f"negative entry id {x}", entry_id=x)
            if not starts:
                starts.append(x)
                ends.append(x)
            elif x == ends[-1] + 1:
                ends[-1] = x
            elif x > ends[-1]:
                starts.append(x)
                ends.append(x)
            elif x < starts[-1]:
                # Out of order: fall back to sorting everything seen so far plus the rest.
                rest = [(y, y) for y in it]
                return cls([*zip(starts, ends, strict=True), (x, x), *rest])
            # else: a duplicate inside the current run, ignored like Java does.
        return cls._from_merged(starts, ends)

    # ---- immutability, equality, pickling -------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EntryRuns):
            return NotImplemented
        return self._starts == other._starts and self._ends == other._ends

    def __hash__(self) -> int:
        return hash((self._starts.tobytes(), self._ends.tobytes()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._starts, self._ends))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"[{s}, {t}]" for s, t in zip(self._starts[:8], self._ends[:8], strict=True)
        )
        more = f", ... {len(self._starts) - 8} more" if len(self._starts) > 8 else ""
        return f"EntryRuns({shown}{more})"

    def __bool__(self) -> bool:
        return len(self._starts) > 0

    def __contains__(self, entry_id: object) -> bool:
        return isinstance(entry_id, int) and self.contains(entry_id)

    # ---- basic queries --------------------------------------------------------------------------

    @property
    def num_runs(self) -> int:
        """Number of maximal runs."""
        return len(self._starts)

    def runs(self) -> Iterator[tuple[int, int]]:
        """Yield the runs ``(start, end)``, ascending."""
        return zip(self._starts, self._ends, strict=True)

    def first_id(self) -> int | None:
        """Smallest entry id, or None if empty."""
        return self._starts[0] if self._starts else None

    def last_id(self) -> int | None:
        """Largest entry id, or None if empty."""
        return self._ends[-1] if self._ends else None

    def contains(self, entry_id: int) -> bool:
        """True if ``entry_id`` is in the set."""
        i = bisect_right(self._starts, entry_id) - 1
        return i >= 0 and entry_id <= self._ends[i]

    def count(self) -> int:
        """Number of entry ids in the set."""
        return self._cum[-1]

    def _count_le(self, x: int) -> int:
        j = bisect_right(self._starts, x)
        if j == 0:
            return 0
        return self._cum[j - 1] + min(self._ends[j - 1], x) - self._starts[j - 1] + 1

    def count_in(self, first: int, last: int) -> int:
        """Number of entry ids in ``[first, last]`` (0 when ``last < first``)."""
        if last < first:
            return 0
        return self._count_le(last) - self._count_le(first - 1)

    def iter_ids(self) -> Iterator[int]:
        """Yield every entry id, ascending (lazy)."""
        for s, t in zip(self._starts, self._ends, strict=True):
            yield from range(s, t + 1)

    def encode(self) -> bytes:
        """The bytes a Java bookie would send for this set (see :func:`encode`)."""
        return encode(self)

    # ---- gaps and stripes -----------------------------------------------------------------------

    def gaps(self, first: int, last: int) -> Iterator[tuple[int, int]]:
        """Yield the maximal ranges of ``[first, last]`` holding no entry id, ascending."""
        starts, ends = self._starts, self._ends
        n = len(starts)
        i = bisect_right(starts, first)
        cur = first
        if i > 0 and ends[i - 1] >= first:
            cur = ends[i - 1] + 1
        while cur <= last:
            if i < n and starts[i] <= last:
                if starts[i] > cur:
                    yield cur, starts[i] - 1
                cur = ends[i] + 1
                i += 1
            else:
                yield cur, last
                return

    def _stripe_args(self, idx: int, first: int, last: int, e: int, wq: int) -> tuple[int, ...]:
        check_quorum(e, wq)
        check_index(idx, e)
        check_range(first, last)
        return stripe_residue_tuple(idx, e, wq)

    def missing_stripe_count(self, idx: int, first: int, last: int, e: int, wq: int) -> int:
        """How many entries of index ``idx``'s stripe in ``[first, last]`` are not in the set.

        Cost O(runs in range x WQ): each gap between runs is counted with residue arithmetic.
        """
        residues = self._stripe_args(idx, first, last, e, wq)
        return sum(count_in_residues(residues, a, b, e) for a, b in self.gaps(first, last))

    def missing_from_stripe(
        self, idx: int, first: int, last: int, e: int, wq: int
    ) -> list[tuple[int, int]]:
        """Ranges ``(a, b)`` in which index ``idx`` lacks every stripe entry it should store.

        Each range is a gap of the set trimmed to its first and last stripe entry, so ``a`` and
        ``b`` are both missing stripe entries; gaps holding no stripe entry are left out. Entries
        of the range that are not on the stripe are not missing (other bookies store them).
        """
        residues = self._stripe_args(idx, first, last, e, wq)
        out: list[tuple[int, int]] = []
        for a, b in self.gaps(first, last):
            fl = first_last_in_residues(residues, a, b, e)
            if fl is not None:
                out.append(fl)
        return out

    def present_on_stripe(
        self, idx: int, first: int, last: int, e: int, wq: int
    ) -> list[tuple[int, int]]:
        """Ranges ``(a, b)`` of the set inside ``[first, last]``, each trimmed to its first and
        last entry on index ``idx``'s stripe; runs holding no stripe entry are left out."""
        residues = self._stripe_args(idx, first, last, e, wq)
        out: list[tuple[int, int]] = []
        j = max(0, bisect_right(self._starts, first) - 1)
        for s, t in zip(self._starts[j:], self._ends[j:], strict=True):
            if s > last:
                break
            a, b = max(s, first), min(t, last)
            if a <= b:
                fl = first_last_in_residues(residues, a, b, e)
                if fl is not None:
                    out.append(fl)
        return out

    def covers(self, first: int, last: int) -> bool:
        """True if every id of ``[first, last]`` is in the set (one run spans it)."""
        i = bisect_right(self._starts, first) - 1
        return i >= 0 and self._ends[i] >= last

    def missing_stripe_entries(
        self, idx: int, first: int, last: int, e: int, wq: int, limit: int | None = None
    ) -> list[int]:
        """Stripe entries of index ``idx`` in ``[first, last]`` not in the set, ascending.

        At most ``limit`` ids are returned (all when None); cost is O(runs x WQ + output).
        """
        residues = self._stripe_args(idx, first, last, e, wq)
        if limit is not None and limit < 0:
            raise IncorrectParameterError(f"negative limit {limit}")
        out: list[int] = []
        if limit == 0:
            return out
        for a, b in self.gaps(first, last):
            for x in iter_residues(residues, a, b, e):
                out.append(x)
                if limit is not None and len(out) >= limit:
                    return out
        return out


def _rebuild(starts: array[int], ends: array[int]) -> EntryRuns:
    return EntryRuns._from_merged(starts, ends)


def _merge_runs(runs: Iterable[tuple[int, int]]) -> tuple[array[int], array[int]]:
    starts: array[int] = array("q")
    ends: array[int] = array("q")
    for s, t in sorted(runs):
        if s < 0 or t < s:
            raise IncorrectParameterError(f"invalid run [{s}, {t}]")
        if starts and s <= ends[-1] + 1:
            if t > ends[-1]:
                ends[-1] = t
        else:
            starts.append(s)
            ends.append(t)
    return starts, ends


def from_entry_ids(entry_ids: Iterable[int]) -> EntryRuns:
    """Shorthand for :meth:`EntryRuns.from_entry_ids`."""
    return EntryRuns.from_entry_ids(entry_ids)


def encode(runs: EntryRuns) -> bytes:
    """Serialize exactly as Java's ``serializeStateOfEntriesOfLedger`` does.

    One 24-byte record ``(start, start, runLength, 0)`` per maximal run after a 64-byte header
    ``(0, numRecords, 56 zero bytes)``. A run longer than 2**31 - 1 ids (impossible in practice;
    Java's int size would overflow) is split into several records so the output stays decodable.
    """
    records: list[bytes] = []
    for s, t in runs.runs():
        while t - s + 1 > _INT_MAX:
            records.append(_GROUP.pack(s, s, _INT_MAX, 0))
            s += _INT_MAX
        records.append(_GROUP.pack(s, s, t - s + 1, 0))
    header = _HEADER.pack(CURRENT_HEADER_VERSION, len(records)) + bytes(HEADER_SIZE - _HEADER.size)
    return header + b"".join(records)


def _bad(msg: str) -> NoReturn:
    raise AvailabilityFormatError(msg)


def decode(
    data: bytes | bytearray | memoryview, max_runs: int = DEFAULT_MAX_DECODED_RUNS
) -> EntryRuns:
    """Parse ``availabilityOfEntriesOfLedger`` bytes into :class:`EntryRuns`.

    Accepts general groups (period > 0, expanded into runs arithmetically; overlapping sequences
    merge). Raises AvailabilityFormatError for a header version other than 0, a length that is not
    exactly 64 + 24 * numSequenceGroups, groups that are not ascending and disjoint, and groups
    whose fields are inconsistent (negative ids, size < 1, last < first, a period that does not
    divide last - first). Java never emits such groups, and guessing their meaning could hide
    missing entries. ``max_runs`` bounds the expansion of periodic groups.
    """
    view = memoryview(data)
    _check_header(view)
    starts: array[int] = array("q")
    ends: array[int] = array("q")
    prev_end = -2  # an entry id never adjacent to a real one
    for k, (first, last, size, period) in enumerate(_GROUP.iter_unpack(view[HEADER_SIZE:])):
        where = f"sequence group {k} ({first}, {last}, {size}, {period})"
        end = _check_group(where, first, last, size, period, prev_end)
        seq_starts, seq_size = _group_sequences(
            where, first, last, size, period, end, len(starts), max_runs
        )
        _append_sequences(starts, ends, seq_starts, seq_size)
        prev_end = end
        if len(starts) > max_runs:
            _bad(f"availability data expands to more than {max_runs} runs")
    return EntryRuns._from_merged(starts, ends)


def _check_header(view: memoryview) -> None:
    """Availability data must have a supported header version and exactly the length its
    sequence group count needs."""
    if view.nbytes < HEADER_SIZE:
        _bad(
            f"availability data of {view.nbytes} bytes is shorter than the {HEADER_SIZE}-byte "
            "header"
        )
    version, n = _HEADER.unpack_from(view, 0)
    if version > CURRENT_HEADER_VERSION:
        _bad(f"unsupported availability header version {version}")
    if version < 0:
        _bad(f"invalid availability header version {version}")
    if n < 0:
        _bad(f"negative sequence group count {n}")
    expected = HEADER_SIZE + GROUP_SIZE * n
    if view.nbytes != expected:
        _bad(f"availability data is {view.nbytes} bytes, {n} sequence groups need {expected}")


def _check_group(where: str, first: int, last: int, size: int, period: int, prev_end: int) -> int:
    """The last entry id of a sequence group, once its fields are consistent and it starts
    after ``prev_end``, the previous group's last entry id."""
    if first < 0 or last < first or size < 1 or period < 0:
        _bad(f"{where}: invalid fields")
    if first != last and (period == 0 or (last - first) % period):
        _bad(f"{where}: last start is not first plus a multiple of the period")
    end = last + size - 1
    if end > _LONG_MAX:
        _bad(f"{where}: ends beyond the largest entry id")
    if first <= prev_end:
        _bad(f"{where}: not ascending and disjoint from the previous group")
    return end


def _group_sequences(
    where: str,
    first: int,
    last: int,
    size: int,
    period: int,
    end: int,
    runs_so_far: int,
    max_runs: int,
) -> tuple[Iterable[int], int]:
    """Where a checked group's sequences start and how long each is: one run when they touch
    or overlap, else one per period (too many on top of ``runs_so_far``: an error)."""
    if first == last or size >= period:
        # One sequence, or sequences that touch/overlap: a single run.
        return (first,), end - first + 1
    if runs_so_far + (last - first) // period + 1 > max_runs:
        _bad(f"{where}: expands to more than {max_runs} runs")
    return range(first, last + 1, period), size


def _append_sequences(
    starts: array[int], ends: array[int], seq_starts: Iterable[int], seq_size: int
) -> None:
    """Append sequences of ``seq_size`` ids to the runs, a sequence starting at or next to
    the last run's end extending it."""
    for s in seq_starts:
        if starts and s <= ends[-1] + 1:
            ends[-1] = s + seq_size - 1
        else:
            starts.append(s)
            ends.append(s + seq_size - 1)
