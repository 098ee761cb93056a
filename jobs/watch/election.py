"""Leader election among ``bkaudit watch`` instances, on a znode of our own.

Each instance holds one ephemeral-sequential member under ``/bkaudit<ledgers root>/
watch-leader`` (``/bkaudit/ledgers/watch-leader``); the lowest sequence leads (the ZooKeeper
election recipe, as kazoo's ``Election`` and BookKeeper's ``auditorelection`` do). It is never
BookKeeper's ``underreplication/auditorelection``: a Java Auditor and a watch leader may
coexist, and they share only the under-replication locks. The member's data says who leads
(``bkaudit status``).

Not under the ledgers root: BookKeeper's ``nukeexistingcluster``
(``AbstractZkLedgerManagerFactory.validateAndNukeExistingCluster``) refuses to run when the
root has a child that is neither special nor a ledger directory.

A member dies with its session, so a killed leader is replaced once its session expires, and
a leader whose session expired is no longer one: :meth:`LeaderElection.is_leader` asks
ZooKeeper, and says no unless the member was created in the client's current session.

:class:`Leadership` is the service's side of it: whether this instance leads now, asked of
ZooKeeper before every step that changes the cluster (:meth:`Leadership.confirm`), and what
``/readyz`` and the leader gauge say about it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bklib.meta import paths
from bklib.meta.stores import KeyNotFound, MetadataStore, StoreUnavailable
from jobs.runtime.messages import one_line
from jobs.watch.http_server import Health
from jobs.watch.metrics import WatchMetrics
from jobs.watch.watcher import ClusterWatcher

__all__ = [
    "LeaderElection",
    "LeaderFence",
    "Leadership",
    "Stopped",
    "election_path",
    "read_leader",
]

log = logging.getLogger("jobs.watch")

PREFIX = "member-"


def election_path(ledgers_root: str) -> str:
    """``/bkaudit<ledgers root>/watch-leader``: our own namespace, one per cluster of the
    chroot, outside BookKeeper's tree."""
    return paths.own_path(ledgers_root, "watch-leader")


def _seq(name: str) -> int:
    try:
        return int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 1 << 62  # a foreign child never leads


def _members(zk: MetadataStore, path: str) -> list[str]:
    try:
        return sorted(zk.children(path), key=_seq)
    except KeyNotFound:
        return []


def read_leader(zk: MetadataStore, ledgers_root: str) -> tuple[dict[str, Any] | None, int]:
    """(the leader's identity, number of members); (None, 0) when no instance runs."""
    path = election_path(ledgers_root)
    members = _members(zk, path)
    for m in members:
        try:
            data, _ = zk.get(paths.join(path, m))
        except KeyNotFound:
            continue
        try:
            info: dict[str, Any] = json.loads(data.decode() or "{}")
        except ValueError:
            info = {"id": m}
        return info, len(members)
    return None, 0


@dataclass(frozen=True)
class LeaderFence:
    """A leader's member of the election, as any session can check it: it exists, belongs
    to the session that created it (``owner``, that session's
    :attr:`~bklib.meta.stores.MetadataStore.session_owner`) and has the lowest sequence. The
    leader asks it of its own session; a repair worker process asks it of its own before
    each ledger (:mod:`jobs.watch.repair_workers`), so a worker never acts for a leader
    whose session is gone."""

    path: str
    node: str
    owner: str | None

    def holds(self, session: MetadataStore) -> bool:
        """Whether the member still leads. A member that cannot be read is not ours (False);
        a listing of the members that fails raises :class:`StoreUnavailable` (the election is
        unavailable: the caller steps down or starts nothing)."""
        try:
            stat = session.exists(paths.join(self.path, self.node))
        except StoreUnavailable:
            return False
        if stat is None or stat.ephemeral_owner != self.owner:
            return False
        members = _members(session, self.path)
        return bool(members) and members[0] == self.node


class LeaderElection:
    """One instance's member. ``identity`` is stored as JSON in the member znode."""

    def __init__(self, zk: MetadataStore, ledgers_root: str, identity: dict[str, Any]) -> None:
        self.zk = zk
        self.root = ledgers_root
        self.path = election_path(ledgers_root)
        self.identity = identity
        self.node: str | None = None

    def join(self) -> None:
        """Create our member (again, after a session loss)."""
        self.zk.ensure_path(self.path)
        created = self.zk.create_sequential(
            paths.join(self.path, PREFIX), json.dumps(self.identity).encode(), ephemeral=True
        )
        self.node = created.rsplit("/", 1)[1]
        log.info("watch: joined the election as %s", self.node)

    def in_current_session(self) -> bool:
        """Our member still exists and belongs to the live session (after a session loss it
        is gone: on ZooKeeper a new session has a new id, and on Oxia, whose client keeps its
        identity across sessions, the server deleted the key). Unknown (the store cannot be
        read) is False: never lead on a guess."""
        if self.node is None:
            return False
        try:
            stat = self.zk.exists(paths.join(self.path, self.node))
        except StoreUnavailable:
            return False
        return stat is not None and stat.ephemeral_owner == self.zk.session_owner

    def fence(self) -> LeaderFence | None:
        """Our member as a :class:`LeaderFence` (None before we joined)."""
        if self.node is None:
            return None
        return LeaderFence(self.path, self.node, self.zk.session_owner)

    def is_leader(self) -> bool:
        """Ask ZooKeeper: our member exists in this session and has the lowest sequence."""
        fence = self.fence()
        return fence is not None and fence.holds(self.zk)

    def leader(self) -> dict[str, Any] | None:
        return read_leader(self.zk, self.root)[0]

    def leave(self) -> None:
        """Delete our member, so a standby takes over at once (not after the session)."""
        if self.node is not None and self.in_current_session():
            with contextlib.suppress(KeyNotFound, StoreUnavailable):
                self.zk.delete(paths.join(self.path, self.node))
        self.node = None


class Stopped(Exception):
    """The service was asked to stop, or lost its leadership, between two steps."""


class Leadership:
    """Whether this instance leads now, as the service acts on it.

    ``leading`` is True from a completed take-over until the term ends; every step that
    changes the cluster calls :meth:`confirm` first, which asks ZooKeeper. ``ready_reason()``
    is what ``/readyz`` says apart from the role (the warehouse's state).
    """

    def __init__(
        self,
        election: LeaderElection,
        watcher: ClusterWatcher,
        stopping: threading.Event,
        health: Health,
        metrics: WatchMetrics,
        ready_reason: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.election = election
        self.watcher = watcher
        self.stopping = stopping
        self.health = health
        self.metrics = metrics
        self.ready_reason = ready_reason
        self.leading = False

    def watch_members(self) -> None:
        """Wake the loop at once when the election's members change (a leader left)."""
        wake = self.watcher.wake

        def changed(_children: list[str] | None) -> None:
            wake.set()

        self.election.zk.watch_children(self.election.path, changed)

    def elected(self) -> bool | None:
        """Ask ZooKeeper whether this instance leads, rejoining the election first when its
        session expired (its member died with it; whatever it knew belongs to the old
        term). True: it leads; False: it stands by; None: unknown, so it steps down (fails
        closed)."""
        e = self.election
        try:
            if not e.in_current_session():
                self.step_down("session expired; rejoining the election")
                e.join()
            leader = e.is_leader()
        except Exception as exc:  # noqa: BLE001 - unknown leadership: step down (fails closed)
            log.warning("watch: election: %s", one_line(exc))
            self.step_down("election unavailable")
            return None
        if not leader:
            self.step_down(None)
        return leader

    def begin_term(self, instance_id: str) -> None:
        """Elected: the take-over starts (``leading`` only once it completed, :meth:`lead`)."""
        log.info("watch: elected leader (%s)", instance_id)
        self.metrics.leader.set(1)
        self.health.role = "leader"
        self.health.ready_reason = None

    def lead(self) -> None:
        """The take-over completed: this instance acts from now on."""
        self.leading = True
        self.health.ready_reason = self.ready_reason()

    def step_down(self, why: str | None) -> None:
        """No longer act: standing by (``why`` None), or disconnected for ``why``."""
        if self.leading:
            log.warning("watch: no longer the leader%s", f" ({why})" if why else "")
        self.leading = False
        self.metrics.leader.set(0)
        if why is None:
            self.health.role = "standby"
            self.health.ready_reason = self.ready_reason()
        else:
            self.health.role = "disconnected"
            self.health.ready_reason = why

    def confirm(self) -> None:
        """Raise :class:`Stopped` unless this instance may act now (asks ZooKeeper)."""
        self.health.heartbeat()  # long work is a series of steps: each one proves liveness
        if self.stopping.is_set():
            raise Stopped("stop requested")
        if not self.watcher.connected or not self.election.is_leader():
            self.leading = False
            raise Stopped("leadership lost; the step is abandoned")

    def may_proceed(self) -> bool:
        """:meth:`confirm` as a yes or no (asked before each ledger of a repair starts)."""
        try:
            self.confirm()
        except Stopped:
            return False
        return True

    def leave(self) -> None:
        """End the term and delete our member, so a standby takes over at once."""
        self.leading = False
        self.metrics.leader.set(0)
        try:
            self.election.leave()
        except Exception as exc:  # noqa: BLE001 - the session may be gone; it ends anyway
            log.debug("watch: leaving the election: %s", exc)
