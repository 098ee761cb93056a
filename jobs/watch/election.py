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
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from bklib.meta import paths
from bklib.meta.stores import KeyNotFound, MetadataStore, StoreUnavailable

__all__ = ["LeaderElection", "election_path", "read_leader"]

log = logging.getLogger("jobs.watch")

PREFIX = "member-"


def election_path(ledgers_root: str) -> str:
    """``/bkaudit<ledgers root>/watch-leader``: our own namespace, one per cluster of the
    chroot, outside BookKeeper's tree."""
    root = "/" + ledgers_root.strip("/")
    return paths.join("/bkaudit" + root.rstrip("/"), "watch-leader")


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

    def is_leader(self) -> bool:
        """Ask ZooKeeper: our member exists in this session and has the lowest sequence."""
        if not self.in_current_session():
            return False
        members = _members(self.zk, self.path)
        return bool(members) and members[0] == self.node

    def leader(self) -> dict[str, Any] | None:
        return read_leader(self.zk, self.root)[0]

    def leave(self) -> None:
        """Delete our member, so a standby takes over at once (not after the session)."""
        if self.node is not None and self.in_current_session():
            with contextlib.suppress(KeyNotFound, StoreUnavailable):
                self.zk.delete(paths.join(self.path, self.node))
        self.node = None
