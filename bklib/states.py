"""The one vocabulary of bkaudit: every name a finding, an action or a run can carry.

Like kazoo's ``protocol/states.py``: plain classes of string constants, so the values go into
Delta tables, Arrow batches and log lines unchanged, and every layer (the engine, the Spark
jobs, the local executor, the reports, the Airflow support module) imports them from here.
This module imports nothing outside the standard library, so the Airflow worker can use it
without bkaudit's dependencies.

It also holds the two small facts every layer needs: BookKeeper's default ledgers root and
how a ``host:port`` bookie id splits.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "DEFAULT_LEDGERS_ROOT",
    "UNKNOWN_RACK",
    "ActionKind",
    "ActionStatus",
    "BookieState",
    "Check",
    "CountKey",
    "Executor",
    "FetchMethod",
    "PulsarFinding",
    "Reason",
    "RepairMode",
    "ReplicaStatus",
    "RunStatus",
    "Scope",
    "Severity",
    "TriageClass",
    "Verdict",
    "parse_host_port",
]

DEFAULT_LEDGERS_ROOT = "/ledgers"
"""BookKeeper's ``zkLedgersRootPath`` default."""


class Check:
    """The names of the audit's checks (``audit_runs.check``, ``audit --check``). Each kind is
    a class of :mod:`bklib.audit.checks`, whose registry lists them: every list of checks
    (the flag's choices, the watch's, the DAG's, the docs' table) comes from there."""

    LOST = "lost"
    """Metadata only: segments naming a bookie that is not registered."""
    REPLICAS = "replicas"
    """Each bookie's entry list (or probe reads) against the stripes it must hold."""
    DEEP = "deep"
    """Every expected replica is read and its digest verified."""
    SAMPLE = "sample"
    """BookKeeper's LedgerChecker: the first and last entry of each fragment on each bookie,
    plus a percentage spread over it, read and digest-verified. Can miss a middle entry."""
    PULSAR = "pulsar"
    """Pulsar's metadata (managed ledgers, cursors, schemas) against BookKeeper's ledgers:
    dangling references and orphan ledgers (``pulsar_checks``, ``pulsar_references``)."""


class Reason:
    """Why a fragment is under-replicated (``underreplicated_fragments.reason``)."""

    BOOKIE_LOST = "BOOKIE_LOST"
    ENTRIES_MISSING = "ENTRIES_MISSING"
    BOOKIE_UNREACHABLE = "BOOKIE_UNREACHABLE"
    """Unknown: the bookie did not answer. Never counted as missing, never as present."""
    DIGEST_MISMATCH = "DIGEST_MISMATCH"
    ALL = (BOOKIE_LOST, ENTRIES_MISSING, BOOKIE_UNREACHABLE, DIGEST_MISMATCH)
    WHOLE_BOOKIE = (BOOKIE_LOST, BOOKIE_UNREACHABLE)
    """Reasons that move a bookie out of every segment naming it (a bookie-level problem)."""
    PLACEMENT_VIOLATION = "PLACEMENT_VIOLATION"
    """Every replica may be present, but some write set of the segment breaks the rack rule of
    BookKeeper's ``RackawareEnsemblePlacementPolicyImpl.isEnsembleAdheringToPlacementPolicy``
    (docs/placement.md). Not under-replication: plain ``rereplicate`` skips it and
    ``rereplicate --fix-placement`` moves one replica at a time. Not in :attr:`ALL`, which
    lists the under-replication reasons."""


class Severity:
    """How bad the worst entry of a fragment is (``underreplicated_fragments.severity``)."""

    NO_REPLICA = "NO_REPLICA"
    """Some entry has no replica left: data loss unless a bookie comes back."""
    BELOW_AQ = "BELOW_AQ"
    BELOW_WQ = "BELOW_WQ"
    ORDER = {NO_REPLICA: 0, BELOW_AQ: 1, BELOW_WQ: 2}
    """Worst first."""
    ALL = (NO_REPLICA, BELOW_AQ, BELOW_WQ)
    NONE = "none"
    """What :meth:`worst` names when no severity is given."""

    @staticmethod
    def worst(severities: Iterable[str | None]) -> str:
        """The worst of ``severities`` (unknown values and None ignored), else :attr:`NONE`."""
        ranked = [s for s in severities if s in Severity.ORDER]
        return min(ranked, key=Severity.ORDER.__getitem__, default=Severity.NONE)


class BookieState:
    """``bookies.state``."""

    WRITABLE = "writable"
    READONLY = "readonly"
    LOST = "lost"
    """Not registered, yet named in some ensemble (the audit), or by a cookie or an
    under-replication mark (``status``)."""
    UNREACHABLE = "unreachable"
    """Registered, but did not answer (``status``'s probe)."""
    ALL = (WRITABLE, READONLY, LOST)
    """The states of the audit's ``bookies`` rows."""
    STATUS = (WRITABLE, READONLY, UNREACHABLE, LOST)
    """The states ``status`` reports, in its order."""


class ReplicaStatus:
    """What one bookie answered about one ledger, before classification."""

    OK = "OK"
    NO_LEDGER = "NO_LEDGER"
    """NoSuchLedger / NoSuchEntry: a negative answer, the only kind that means missing."""
    UNREACHABLE = "UNREACHABLE"


class FetchMethod:
    """How a bookie's holdings were learnt."""

    LIST = "LIST"
    """GET_LIST_OF_ENTRIES_OF_LEDGER."""
    PROBE = "PROBE"
    """Reads, because the bookie does not list (DbLedgerStorage)."""
    READ = "READ"
    """Reads with digest verification (the deep check)."""
    SAMPLE = "SAMPLE"
    """Reads of a sample with digest verification (the sample check)."""


class RunStatus:
    """``audit_runs.status``."""

    COMPLETED = "COMPLETED"
    COMPLETED_WITH_ERRORS = "COMPLETED_WITH_ERRORS"
    """Finished, but some znodes were unreadable or some bookies unreachable (rows say which)."""
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"
    """Stopped by SIGINT or SIGTERM before it finished (exit 130 / 143): never acted on."""
    FINISHED = (COMPLETED, COMPLETED_WITH_ERRORS)
    """Statuses whose findings a reader may act on."""


class ActionKind:
    """``replication_actions.action``."""

    FENCE_AND_CLOSE = "FENCE_AND_CLOSE"
    COPY = "COPY"
    METADATA_UPDATE = "METADATA_UPDATE"
    SKIP = "SKIP"
    CLEAR_MARK = "CLEAR_MARK"
    """A marked ledger the latest audit did not flag, checked now and found fully replicated:
    its under-replication mark is removed, as BookKeeper's ReplicationWorker does."""
    UNLOAD_TOPIC = "UNLOAD_TOPIC"
    """A Pulsar topic unloaded through the admin API after its ledgers were repaired, so its
    broker drops stale ledger handles (``topic`` names it; docs/pulsar.md)."""
    DELETE_ORPHAN = "DELETE_ORPHAN"
    """``bkaudit orphans delete``: a ledger Pulsar no longer lists, deleted (its metadata
    removed by compare-and-set; the bookies reclaim its entries)."""
    NOT_LEDGER_REPAIRS = frozenset({UNLOAD_TOPIC, DELETE_ORPHAN})
    """Actions that say nothing about their ledger's repair status: readers that decide
    whether a ledger is repaired leave them out."""


class PulsarFinding:
    """``pulsar_references.kind``."""

    DANGLING = "DANGLING"
    """Pulsar names a ledger BookKeeper does not have: the topic's reads fail."""
    ORPHAN = "ORPHAN"
    """A ledger Pulsar's tags give an owner that does not list it: disk held forever."""
    ERROR = "ERROR"
    """A Pulsar key that could not be decoded: what it references is unknown."""


class ActionStatus:
    """``replication_actions.status``. DONE, PLANNED, SKIPPED and MANUAL are final; FAILED, LOCKED,
    DISABLED and WAITING_GRACE are retried by the next run; NO_REPLICA is terminal (the entries
    named in ``no_replica_entries`` exist nowhere)."""

    DONE = "DONE"
    PLANNED = "PLANNED"
    """``--dry-run``: what would have been done."""
    SKIPPED = "SKIPPED"
    MANUAL = "MANUAL"
    """A step bkaudit was not asked to take and an operator should (a topic unload without
    ``--pulsar-admin-url``): not a failure, and final; the listing says what to run."""
    FAILED = "FAILED"
    WAITING_GRACE = "WAITING_GRACE"
    NO_REPLICA = "NO_REPLICA"
    """Not to be confused with :attr:`Severity.NO_REPLICA`: here the copy found no source."""
    LOCKED = "LOCKED"
    """Another worker (ours or a Java ReplicationWorker) holds the ledger's lock."""
    DISABLED = "DISABLED"
    """``underreplication/disable`` exists: autorecovery is switched off cluster-wide."""
    FINAL = frozenset({DONE, PLANNED, SKIPPED, MANUAL})


class RepairMode:
    """``replication_actions.mode``: which command wrote the row."""

    REREPLICATE = "rereplicate"
    RECOVER = "recover"
    DECOMMISSION = "decommission"
    ALL = (REREPLICATE, RECOVER, DECOMMISSION)
    ORPHANS = "orphans"
    """``bkaudit orphans delete`` (not a repair: its rows are DELETE_ORPHAN actions)."""


class Executor:
    """Where the engine runs (``--executor``; the ``executor`` column of the tables)."""

    SPARK = "spark"
    LOCAL = "local"
    AUTO = "auto"
    ALL = (SPARK, LOCAL, AUTO)


class CountKey:
    """Keys of ``audit_runs.counts``, written by the audit and read by reports and Airflow."""

    LEDGERS = "ledgers"
    LEDGERS_EXPECTED = "ledgers_expected"
    """Ledger znodes the directory stats announced before the scan."""
    LEDGER_DIRS_CHANGED = "ledger_dirs_changed"
    """Directories with ledgers created or deleted while the scan ran (explains a difference)."""
    LEDGERS_UNACCOUNTED = "ledgers_unaccounted"
    """Announced ledgers the scan lost, or found, in directories that did not change: a run
    with any is never COMPLETED."""
    LEDGERS_FROM_INDEX = "ledgers_from_index"
    """Set only on a watch's run that read just the ledgers its bookie index names for the lost
    bookies (docs/watch.md, "The index"): not a full scan, so neither the watch's schedule nor
    a scan's accounting counts it as one."""
    METADATA_ERRORS = "metadata_errors"
    LEDGERS_NOT_CLOSED = "ledgers_not_closed"
    FRAGMENTS = "fragments"
    UNDERREPLICATED_LEDGERS = "underreplicated_ledgers"
    MISSING_ENTRIES = "missing_entries"
    BOOKIE_LEDGER_PAIRS = "bookie_ledger_pairs"
    FRAGMENTS_BEFORE_REREAD = "fragments_before_reread"
    DROPPED_AFTER_REREAD = "dropped_after_reread"
    BOOKIES_NO_LIST_ENTRIES = "bookies_no_list_entries"
    """Bookies the run's capability probe found not answering list-entries (DbLedgerStorage):
    learnt once per run, then probed by reads in every task."""
    BOOKIES_BATCH_READ = "bookies_batch_read"
    """Bookies serving the v2 BATCH_READ (BookKeeper 4.17+), used for probes and deep reads."""
    PLACEMENT_SEGMENTS = "placement_segments"
    """Segments of closed ledgers checked against the placement rule (0: no racks known)."""
    PLACEMENT_VIOLATIONS = "placement_violations"
    """Segments whose ensemble FAILs the placement rule (one PLACEMENT_VIOLATION row each)."""
    PLACEMENT_LEDGERS = "placement_ledgers"
    """Ledgers with at least one placement violation."""
    PLACEMENT_RACKS = "placement_racks"
    """Distinct racks of the bookies the check saw (the unknown rack included)."""
    PLACEMENT_UNKNOWN_RACK_BOOKIES = "placement_unknown_rack_bookies"
    """Bookies named in ensembles with no rack: together they count as one rack, "unknown"."""

    @staticmethod
    def reason(reason: str) -> str:
        """Fragments with ``reason``."""
        return f"reason_{reason}"

    SEVERITY_PREFIX = "severity_"

    @staticmethod
    def severity(severity: str) -> str:
        """Fragments of ``severity``."""
        return f"{CountKey.SEVERITY_PREFIX}{severity}"

    @staticmethod
    def bookies(state: str) -> str:
        """Bookies in ``state`` (a :class:`BookieState`)."""
        return f"bookies_{state}"

    @staticmethod
    def pairs(method: str, status: str) -> str:
        """(ledger, bookie) pairs fetched by ``method`` that ended in ``status``."""
        return f"pairs_{method}_{status}"


def parse_host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` -> (host, port), or None when ``address`` has no valid port: the one
    rule for every bookie id, whether listed, resolved or checked.

    Ids split as Java's ``BookieSocketAddress(String)`` splits them: on ``:``, the first two
    parts, the port read as ``Integer.parseInt`` reads it (an optional sign, ASCII digits), so
    ``"a:1:2"`` is ``("a", 1)`` and ``"a:+3181"`` is ``("a", 3181)``. ``[v6addr]:port`` gives
    the address without brackets (Java cannot split it; bkaudit's own bookies may use it).
    """
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        if not sep or not host or not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        parts = address.split(":")
        if len(parts) < 2 or not parts[0]:
            return None
        host, port_text = parts[0], parts[1]
    digits = port_text[1:] if port_text[:1] in ("+", "-") else port_text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    port = int(port_text)
    if not 0 <= port <= 65535:
        return None
    return host, port


class Scope:
    """What a blast-radius row (``blast_radius.scope``) or a what-if question fails."""

    BOOKIE = "bookie"
    RACK = "rack"
    ALL = (BOOKIE, RACK)


UNKNOWN_RACK = "unknown"
"""The one rack every bookie without a rack in Pulsar's ``/bookies`` document counts as."""


class Verdict:
    """``bkaudit whatif``: may the given bookies stop now?"""

    SAFE = "SAFE"
    """No entry would fall below AQ, and every open ledger's writer could replace them."""
    UNSAFE = "UNSAFE"


class TriageClass:
    """``triage.class``: why a NO_REPLICA or stuck ledger cannot be repaired."""

    WRITE_QUORUM_ONE = "WRITE_QUORUM_ONE"
    """WQ = 1 by design: one copy only, lost with its bookie."""
    DELETED = "DELETED"
    """The ledger no longer exists in ZooKeeper: nothing to repair."""
    ENTRIES_LOST = "ENTRIES_LOST"
    """Some entries are missing on every replica of their write set (ids listed)."""
    NO_REPLACEMENT = "NO_REPLACEMENT"
    """Not enough writable bookies (or racks) outside the ensemble for a replacement."""
    OTHER = "OTHER"
    """Stuck for another reason (the repair's last error says which)."""
    ALL = (WRITE_QUORUM_ONE, DELETED, ENTRIES_LOST, NO_REPLACEMENT, OTHER)
