"""The audit engine's types: what a ledger is to the checker, what a bookie answered about it,
and what the checker found.

Each type converts to and from the plain row (a dict) the Delta tables and Arrow batches hold,
so both executors move the same values: the local executor keeps the objects, the Spark
executor ships rows between tasks and rebuilds the objects inside them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bklib.meta.model import DigestType, LedgerMetadata, LedgerState
from bklib.meta.pulsar import decode_pulsar_metadata
from bklib.states import FetchMethod, ReplicaStatus

__all__ = [
    "Finding",
    "LedgerView",
    "ReplicaReport",
    "SegmentSpan",
    "named_bookies",
    "runs_from_rows",
    "runs_to_rows",
]

Run = tuple[int, int]


def runs_to_rows(runs: Iterable[Run]) -> list[dict[str, int]]:
    """``[(first, last), ...]`` as the RUNS column holds them."""
    return [{"first_entry_id": a, "last_entry_id": b} for a, b in runs]


def runs_from_rows(rows: Sequence[Mapping[str, int]] | None) -> list[Run]:
    """The inverse of :func:`runs_to_rows` (None is no runs)."""
    return [(int(r["first_entry_id"]), int(r["last_entry_id"])) for r in rows or ()]


@dataclass(frozen=True, slots=True)
class SegmentSpan:
    """One segment of a ledger with its end resolved: ``last_entry_id`` is None only for the
    open last segment, which ends at the LAC that only the bookies know."""

    first_entry_id: int
    last_entry_id: int | None
    ensemble: tuple[str, ...]

    def as_row(self) -> dict[str, Any]:
        return {
            "first_entry_id": self.first_entry_id,
            "last_entry_id": self.last_entry_id,
            "ensemble": list(self.ensemble),
        }


# Enum names by member, without Enum.name's descriptor (a scan names a million).
_STATE_NAMES = {s: s.name for s in LedgerState}
_DIGEST_NAMES = {d: d.name for d in DigestType}


def segment_spans(md: LedgerMetadata) -> tuple[SegmentSpan, ...]:
    """Every segment of ``md`` with the end :meth:`LedgerMetadata.segment_ends`
    gives it; the open last segment's end stays unknown."""
    ends = md.segment_ends()
    open_last = len(ends) - 1 if not md.is_closed else -1
    out = []
    for i, (s, end) in enumerate(zip(md.segments, ends, strict=True)):
        out.append(SegmentSpan(s.first_entry_id, end if i != open_last else None, s.ensemble))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LedgerView:
    """One ledger znode as the audit sees it (a row of the ``ledgers`` table).

    ``error`` is set, and the metadata fields are None, for a znode that could not be read or
    parsed; the error names the znode. ``password`` is needed to verify HMAC digests and is
    never written to a table.
    """

    ledger_id: int
    znode_path: str | None = None
    znode_version: int | None = None
    state: str | None = None
    ensemble_size: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    last_entry_id: int | None = None
    length: int | None = None
    digest_type: str | None = None
    password: bytes | None = None
    ctime: int | None = None
    segments: tuple[SegmentSpan, ...] | None = None
    error: str | None = None
    topic: str | None = None
    """The Pulsar topic from the custom metadata (:mod:`bklib.meta.pulsar`), if any."""
    component: str | None = None
    """Pulsar's ``component`` tag: managed-ledger, compacted-ledger, schema."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def is_closed(self) -> bool:
        return self.state == LedgerState.CLOSED.name

    def bookies(self) -> list[str]:
        """Every bookie named in any segment, in first-seen order."""
        return list(dict.fromkeys(b for s in self.segments or () for b in s.ensemble))

    @classmethod
    def from_metadata(
        cls, md: LedgerMetadata, path: str | None = None, version: int | None = None
    ) -> LedgerView:
        pulsar = decode_pulsar_metadata(md.custom_metadata)
        digest = md.digest_type
        return cls(
            ledger_id=md.ledger_id,
            znode_path=path,
            znode_version=version,
            state=_STATE_NAMES[md.state],
            ensemble_size=md.ensemble_size,
            write_quorum=md.write_quorum,
            ack_quorum=md.ack_quorum,
            last_entry_id=md.last_entry_id,
            length=md.length,
            digest_type=_DIGEST_NAMES[digest] if digest is not None else None,
            password=md.password,
            ctime=md.ctime,
            segments=segment_spans(md),
            topic=pulsar.topic,
            component=pulsar.component,
        )

    @classmethod
    def unreadable(cls, ledger_id: int, path: str | None, error: str) -> LedgerView:
        return cls(ledger_id=ledger_id, znode_path=path, error=error)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LedgerView:
        segs = row.get("segments")
        return cls(
            ledger_id=int(row["ledger_id"]),
            znode_path=row.get("znode_path"),
            znode_version=row.get("znode_version"),
            state=row.get("state"),
            ensemble_size=row.get("ensemble_size"),
            write_quorum=row.get("write_quorum"),
            ack_quorum=row.get("ack_quorum"),
            last_entry_id=row.get("last_entry_id"),
            length=row.get("length"),
            digest_type=row.get("digest_type"),
            password=row.get("password"),
            ctime=row.get("ctime"),
            segments=(
                tuple(
                    SegmentSpan(s["first_entry_id"], s["last_entry_id"], tuple(s["ensemble"]))
                    for s in segs
                )
                if segs is not None
                else None
            ),
            error=row.get("error"),
            topic=row.get("topic"),
            component=row.get("component"),
        )

    def as_row(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "znode_path": self.znode_path,
            "znode_version": self.znode_version,
            "state": self.state,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type,
            "password": self.password,
            "ctime": self.ctime,
            "segments": (
                [s.as_row() for s in self.segments] if self.segments is not None else None
            ),
            "error": self.error,
            "topic": self.topic,
            "component": self.component,
        }


def named_bookies(views: Iterable[LedgerView]) -> set[str]:
    """Every bookie some segment of a readable view names: with the registrations, what
    tells a lost bookie. Walks the segments directly, without :meth:`LedgerView.bookies`'
    ordered list per ledger (a scan has a million views)."""
    return {b for v in views if v.ok for s in v.segments or () for b in s.ensemble}


@dataclass(frozen=True)
class ReplicaReport:
    """What one bookie holds of one ledger, as the checker learnt it.

    ``entries`` are the ids it holds, as sorted merged runs; ``bad_entries`` (deep check) are
    held but fail their digest; ``unknown_entries`` are ids whose read failed with a timeout
    or error: neither held nor missing. ``lac`` is the bookie's LAC of a ledger that is not
    closed (max of the explicit and the piggybacked one).
    """

    ledger_id: int
    bookie_id: str
    status: str = ReplicaStatus.OK
    method: str = FetchMethod.LIST
    entries: tuple[Run, ...] = ()
    bad_entries: tuple[Run, ...] = ()
    unknown_entries: tuple[Run, ...] = ()
    lac: int | None = None
    error: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ReplicaReport:
        return cls(
            ledger_id=int(row["ledger_id"]),
            bookie_id=row["bookie_id"],
            status=row["status"],
            method=row.get("method") or FetchMethod.LIST,
            entries=tuple(runs_from_rows(row.get("entries"))),
            bad_entries=tuple(runs_from_rows(row.get("bad_entries"))),
            unknown_entries=tuple(runs_from_rows(row.get("unknown_entries"))),
            lac=row.get("lac"),
            error=row.get("error"),
        )

    def as_row(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "bookie_id": self.bookie_id,
            "status": self.status,
            "method": self.method,
            "entries": runs_to_rows(self.entries),
            "bad_entries": runs_to_rows(self.bad_entries),
            "unknown_entries": runs_to_rows(self.unknown_entries),
            "lac": self.lac,
            "error": self.error,
        }


@dataclass(frozen=True)
class Finding:
    """One under-replicated fragment: a (ledger, segment, bookie) and why (a row of
    ``underreplicated_fragments`` before the run's columns are added)."""

    ledger_id: int
    segment_index: int
    segment_first_entry_id: int
    segment_last_entry_id: int | None
    bookie_index: int
    bookie_id: str
    reason: str
    expected_entries: int | None = None
    missing_entries: int | None = None
    missing_ranges: tuple[Run, ...] | None = None
    missing_ranges_truncated: bool | None = None
    unknown_entries: int | None = None
    min_replicas: int | None = None
    severity: str | None = None
    ledger_state: str | None = None
    ensemble_size: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    error: str | None = None
    topic: str | None = None
    component: str | None = None

    @property
    def key(self) -> tuple[int, int, str]:
        """(ledger, segment first entry, bookie): what identifies a fragment across runs."""
        return self.ledger_id, self.segment_first_entry_id, self.bookie_id

    def as_row(self) -> dict[str, Any]:
        row = {k: getattr(self, k) for k in FINDING_COLUMNS}
        if self.missing_ranges is not None:
            row["missing_ranges"] = runs_to_rows(self.missing_ranges)
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Finding:
        values: dict[str, Any] = {k: row.get(k) for k in FINDING_COLUMNS}
        if values["missing_ranges"] is not None:
            values["missing_ranges"] = tuple(runs_from_rows(values["missing_ranges"]))
        return cls(**values)


FINDING_COLUMNS = (
    "ledger_id",
    "segment_index",
    "segment_first_entry_id",
    "segment_last_entry_id",
    "bookie_index",
    "bookie_id",
    "reason",
    "expected_entries",
    "missing_entries",
    "missing_ranges",
    "missing_ranges_truncated",
    "unknown_entries",
    "min_replicas",
    "severity",
    "ledger_state",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "error",
    "topic",
    "component",
)
"""The columns a finding contributes to ``underreplicated_fragments``, in table order."""
