"""What the watch reads from the metadata store, and the watches that wake it.

One store session per instance (ZooKeeper or Oxia): it holds the election member, watches
``available`` and ``available/readonly`` (any change wakes the loop at once; a poll is the
backstop), and reads the ``underreplication`` flags each cycle. Its state listener records
suspensions and session losses, so the loop never acts on what it read before a
disconnection.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field

from bklib.meta import paths
from bklib.meta.cluster import MetadataDriver
from bklib.meta.formats import PULSAR_AUDITOR_LEADER, decode_pulsar_leader
from bklib.meta.registration import registered_ids
from bklib.meta.stores import KeyNotFound, MetadataStore, SessionState
from bklib.meta.underreplication import UnderReplicationManager

__all__ = ["ClusterSnapshot", "ClusterWatcher"]

log = logging.getLogger("jobs.watch")


@dataclass(frozen=True)
class ClusterSnapshot:
    """The cluster state one cycle decides on."""

    writable: frozenset[str]
    readonly: frozenset[str]
    delay_znode: int | None
    """``underreplication/lostBookieRecoveryDelay`` (seconds), None when absent."""
    disabled: bool
    """``underreplication/disable`` exists: autorecovery is paused."""
    auditor: str | None = None
    """The Java Auditor elected (``underreplication/auditorelection``, or Pulsar's
    ``underreplication/leader``), if any."""
    marked: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Under-replication marks: ledger -> missing replicas."""

    @property
    def available(self) -> frozenset[str]:
        """Writable or read-only: a read-only bookie serves reads, so it is not lost."""
        return self.writable | self.readonly


def auditor_key(ledgers_root: str, driver: MetadataDriver) -> str:
    """Where the driver's Java Auditor is elected (for the operator: ``status``)."""
    base = paths.ur_base(ledgers_root)
    if driver is MetadataDriver.PULSAR:
        return paths.join(base, PULSAR_AUDITOR_LEADER)
    return paths.join(base, "auditorelection")


def java_auditor(zk: MetadataStore, ledgers_root: str) -> str | None:
    """The bookie id of the Java Auditor, or None when none is elected.

    On Pulsar's driver (``PulsarLedgerAuditorManager``) the leader holds the ephemeral key
    ``underreplication/leader``, whose data is the bookie id as a JSON string. On BookKeeper's
    (``ZkLedgerAuditorManager``) the lowest vote under ``underreplication/auditorelection``
    leads; its data is a text-format ``AuditorVoteFormat`` with ``bookieId: "..."``."""
    base = paths.ur_base(ledgers_root)
    try:
        data, _ = zk.get(paths.join(base, PULSAR_AUDITOR_LEADER))
    except KeyNotFound:
        pass
    else:
        return decode_pulsar_leader(data)
    path = paths.join(base, "auditorelection")
    try:
        votes = [c for c in zk.children(path) if c.startswith("V_")]
    except KeyNotFound:
        return None
    for v in sorted(votes, key=lambda c: c.rsplit("_", 1)[-1]):
        try:
            data, _ = zk.get(paths.join(path, v))
        except KeyNotFound:
            continue
        text = data.decode(errors="replace")
        if "bookieId:" in text:
            return str(text.split("bookieId:", 1)[1].strip().strip('"').split('"', 1)[0])
        return str(text.strip() or v)
    return None


class ClusterWatcher:
    """The session, its state, the registration watches and the snapshot reader."""

    def __init__(self, zk: MetadataStore, ledgers_root: str) -> None:
        self.zk = zk
        self.root = ledgers_root
        self.urm = UnderReplicationManager(zk, ledgers_root)
        self.wake = threading.Event()
        self.state = SessionState.CONNECTED if zk.connected else SessionState.SUSPENDED
        self.lost_sessions = 0
        zk.add_state_listener(self.on_state)
        self._watching: set[str] = set()

    def on_state(self, state: SessionState) -> None:
        # Called on the store's thread: record and wake, never block.
        if state is SessionState.LOST:
            self.lost_sessions += 1
        self.state = state
        level = logging.INFO if state is SessionState.CONNECTED else logging.WARNING
        store = "Oxia" if self.zk.kind == "oxia" else "ZooKeeper"
        log.log(level, "watch: %s session %s", store, state.name)
        self.wake.set()

    @property
    def connected(self) -> bool:
        return bool(self.state is SessionState.CONNECTED and self.zk.connected)

    def watch_registrations(self) -> None:
        """Wake the loop on any change of ``available`` or ``available/readonly`` (kazoo's
        watches are re-armed after a reconnection; Oxia's come from its notification stream);
        ``readonly`` is watched once it exists."""
        avail = paths.join(self.root, "available")
        for path in (avail, paths.join(avail, "readonly")):
            if path in self._watching or self.zk.exists(path) is None:
                continue
            self._watching.add(path)

            def changed(_children: list[str] | None) -> None:
                self.wake.set()

            with contextlib.suppress(KeyNotFound):
                self.zk.watch_children(path, changed)

    def snapshot(self, with_marks: bool = True) -> ClusterSnapshot:
        """Read the registrations, the flags and (optionally) the marks now. Only the bookies'
        names: their data is not read, so an idle cycle's requests do not grow with them."""
        writable, readonly = registered_ids(self.zk, self.root)
        marked = (
            {m.ledger_id: m.missing_replicas for m in self.urm.list_underreplicated()}
            if with_marks
            else {}
        )
        return ClusterSnapshot(
            writable=writable,
            readonly=readonly,
            delay_znode=self._delay(),
            disabled=not self.urm.is_replication_enabled(),
            auditor=java_auditor(self.zk, self.root),
            marked=marked,
        )

    def _delay(self) -> int | None:
        try:
            return self.urm.get_lost_bookie_recovery_delay()
        except ValueError:  # not a number: BookKeeper would fail too; treat as absent
            log.warning("watch: lostBookieRecoveryDelay znode is not a number; ignored")
            return None
