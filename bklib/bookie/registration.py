"""Metadata-store side of the Python bookie: cookie check and registration, in the formats of
BookKeeper's ``Cookie`` and ``ZKRegistrationManager`` (Pulsar's ``PulsarRegistrationManager``
writes the same keys on Oxia).

Cookie rules, checked before the bookie serves anything:

* neither ``<root>/cookies/<bookieId>`` nor ``<data_dir>/current/VERSION`` exists: a new
  bookie; write the local file (fsync'd) and then create the znode;
* ZooKeeper has a cookie but the data dir has none: refuse (:class:`CookieError`). The data
  dir was wiped or replaced; a bookie rejoining with no data would answer "no such ledger"
  for entries it once acknowledged, which readers take as proof the entries never existed
  (docs/safety-rules.md rule 13). Deleting the znode is the operator's explicit "this is a
  new bookie";
* both exist and differ (other bookie id, moved data dir, other cluster instance): refuse;
* only the local file exists: the znode is recreated from it (the data is intact), unless it
  names another bookie or cluster instance.

Registration: an ephemeral ``<root>/available/<bookieId>`` (writable) or
``<root>/available/readonly/<bookieId>`` (read-only; created first, then the writable node is
deleted) holding a BookieServiceInfo with one ``bookie-rpc`` endpoint. A node left by a
previous incarnation (kill -9: its session is still alive) is waited for until it expires.
After a session expiry the store opens a new session and the bookie re-registers.

On a secured ZooKeeper (``zk_auth``: a :class:`~bklib.meta.stores.zookeeper.security.ZkAccess` with
TLS and SASL) the cookie and registration znodes get CREATOR_ALL ACLs under
``zkEnableSecurity``, as a Java bookie's ``ZKRegistrationManager`` creates them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bklib.durable import write_atomically
from bklib.errors import BKError, ZKError
from bklib.meta.formats import (
    COOKIE_LAYOUT_VERSION,
    Cookie,
    encode_cookie,
    encode_service_info,
    parse_cookie,
    service_info_for,
)
from bklib.meta.model import is_valid_bookie_id
from bklib.meta.stores import KeyExists, KeyNotFound, MetadataStore, SessionState, open_store
from bklib.meta.stores.zookeeper import ZooKeeperStore
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.states import DEFAULT_LEDGERS_ROOT

log = logging.getLogger(__name__)


class CookieError(BKError):
    """The data dir's cookie and ZooKeeper's disagree: the bookie must not start."""


def check_bookie_id(bookie_id: str) -> str:
    """Validate a bookie id as BookKeeper does; returns it."""
    if not is_valid_bookie_id(bookie_id):
        raise ValueError(f"invalid bookie id {bookie_id!r}")
    return bookie_id


def local_cookie_path(data_dir: Path) -> Path:
    return Path(data_dir) / "current" / "VERSION"


def read_local_cookie(data_dir: Path) -> Cookie | None:
    path = local_cookie_path(data_dir)
    try:
        return parse_cookie(path.read_bytes())
    except FileNotFoundError:
        return None


def write_local_cookie(data_dir: Path, cookie: Cookie) -> None:
    """Write ``current/VERSION`` atomically and durably."""
    path = local_cookie_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, encode_cookie(cookie), tmp=path.with_suffix(".tmp"))


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


class Registration:
    """One bookie's metadata-store session: cookie, registration, re-registration on expiry.

    ``zk_hosts`` is a store locator: a ZooKeeper connect string or ``oxia://HOST:PORT/NS``.
    All methods block; the bookie calls them from a worker thread. ``on_session_restored`` is
    called from the store's thread after a lost session came back.
    """

    def __init__(
        self,
        zk_hosts: str,
        *,
        bookie_id: str,
        host: str,
        port: int,
        root: str = DEFAULT_LEDGERS_ROOT,
        session_timeout: float = 10.0,
        on_session_restored: Callable[[], None] | None = None,
        zk_auth: ZkAuth = None,
    ) -> None:
        self.bookie_id = check_bookie_id(bookie_id)
        self.host = host
        self.port = port
        self.root = "/" + root.strip("/")
        self.session_timeout = session_timeout
        self.on_session_restored = on_session_restored
        self.zk_hosts = zk_hosts
        self.zk_auth = zk_auth
        self._zk: MetadataStore | None = None
        self._lost = False
        self._stopping = False
        self.readonly: bool | None = None  # what is registered now; None: nothing
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    @property
    def writable_path(self) -> str:
        return _join(self.root, "available", self.bookie_id)

    @property
    def readonly_path(self) -> str:
        return _join(self.root, "available", "readonly", self.bookie_id)

    @property
    def cookie_path(self) -> str:
        return _join(self.root, "cookies", self.bookie_id)

    @property
    def zk(self) -> MetadataStore:
        """The open store session (after :meth:`start`)."""
        if self._zk is None:
            raise ZKError("registration not started", bookie=self.bookie_id)
        return self._zk

    def start(self, timeout: float = 30.0) -> None:
        """Open the store session; a rejected certificate or SASL secret raises
        :class:`~bklib.meta.stores.zookeeper.security.ZkSecurityError` at once."""
        self._zk = open_store(
            self.zk_hosts, auth=self.zk_auth, timeout=timeout, session_timeout=self.session_timeout
        )
        self._zk.add_state_listener(self._state_listener)

    def stop(self) -> None:
        """Close the session: the ephemeral registration disappears at once."""
        self._stopping = True
        self._stopped.set()  # wakes a registration still waiting for a stale node
        if self._zk is not None:
            self._zk.close()

    def session(self) -> tuple[int, bytes]:
        """(session id, password) of the current ZooKeeper session (tests expire it with
        these); (0, b"") on another store."""
        if not isinstance(self._zk, ZooKeeperStore):
            return 0, b""
        sid, pwd = self._zk.client.client_id or (0, b"")
        return int(sid), bytes(pwd)

    def _state_listener(self, state: SessionState) -> None:
        # Runs on the store's thread and must not block.
        if self._stopping:
            return
        if state is SessionState.LOST:
            log.warning("bookie %s: %s session lost", self.bookie_id, self.zk.kind)
            self._lost = True
            self.readonly = None
        elif state is SessionState.CONNECTED and self._lost:
            self._lost = False
            log.warning("bookie %s: new %s session, re-registering", self.bookie_id, self.zk.kind)
            if self.on_session_restored is not None:
                self.on_session_restored()

    # -- cookie ----------------------------------------------------------------------------

    def expected_cookie(self, data_dir: Path) -> Cookie:
        """The cookie this bookie would write now."""
        instance_id: str | None = None
        try:
            data, _ = self.zk.get(_join(self.root, "INSTANCEID"))
            instance_id = data.decode().strip() or None
        except KeyNotFound:
            pass
        d = str(Path(data_dir).resolve())
        return Cookie(
            layout_version=COOKIE_LAYOUT_VERSION,
            bookie_host=self.bookie_id,
            journal_dirs=[d],
            ledger_dirs=[d],
            instance_id=instance_id,
            index_dirs=None,
        )

    def check_cookie(self, data_dir: Path) -> Cookie:
        """Apply the cookie rules of the module docstring; raises CookieError to refuse."""
        expected = self.expected_cookie(data_dir)
        local = read_local_cookie(data_dir)
        try:
            data, _ = self.zk.get(self.cookie_path)
            remote: Cookie | None = parse_cookie(data)
        except KeyNotFound:
            remote = None
        where = f"data dir {data_dir}, znode {self.cookie_path}"
        if remote is not None and local is None:
            raise CookieError(
                f"ZooKeeper has a cookie for bookie {self.bookie_id} but the data dir has none "
                f"({where}): the data dir was wiped or replaced. Refusing to start, because "
                "this bookie would deny holding entries it acknowledged. If this really is a "
                "new bookie, delete the cookie znode first.",
                bookie=self.bookie_id,
            )
        if local is not None and not _same(local, expected):
            raise CookieError(
                f"the data dir's cookie {local} does not match this bookie {expected} ({where})",
                bookie=self.bookie_id,
            )
        if remote is not None and not _same(remote, expected):
            raise CookieError(
                f"ZooKeeper's cookie {remote} does not match this bookie {expected} ({where})",
                bookie=self.bookie_id,
            )
        if local is None:
            write_local_cookie(data_dir, expected)
            log.info("bookie %s: new bookie, cookie written to %s", self.bookie_id, data_dir)
        if remote is None:
            self.zk.ensure_path(_join(self.root, "cookies"))
            try:
                self.zk.create(self.cookie_path, encode_cookie(expected))
            except KeyExists:
                # Another process raced us; trust nothing and check again.
                return self.check_cookie(data_dir)
            log.info("bookie %s: cookie created at %s", self.bookie_id, self.cookie_path)
        return expected

    # -- registration ----------------------------------------------------------------------

    def register(self, readonly: bool) -> None:
        """Make the registration match ``readonly`` (idempotent)."""
        with self._lock:
            if self.readonly is readonly and self._owned(self._path(readonly)):
                return
            data = encode_service_info(service_info_for(self.host, self.port))
            self.zk.ensure_path(_join(self.root, "available", "readonly"))
            self._create_ephemeral(self._path(readonly), data)
            self._delete_if_owned(self._path(not readonly))
            self.readonly = readonly
            log.info(
                "bookie %s: registered %s at %s",
                self.bookie_id,
                "read-only" if readonly else "writable",
                self._path(readonly),
            )

    def _path(self, readonly: bool) -> str:
        return self.readonly_path if readonly else self.writable_path

    def _owned(self, path: str) -> bool:
        stat = self.zk.exists(path)
        return stat is not None and stat.ephemeral_owner == self.zk.session_owner

    def _create_ephemeral(self, path: str, data: bytes) -> None:
        # A node owned by an older session (our previous incarnation, killed) goes away when
        # that session expires; wait up to twice the timeout, as a Java bookie does.
        deadline_wait = 2 * self.session_timeout + 2
        while True:
            try:
                self.zk.create(path, data, ephemeral=True)
                return
            except KeyExists:
                if self._owned(path):
                    self.zk.set(path, data)
                    return
            if self.zk.exists(path) is None:
                continue
            log.info("bookie %s: waiting for stale registration %s to expire", self.bookie_id, path)
            deadline = time.monotonic() + deadline_wait
            gone = False
            # Poll (every store can): the old session's node goes when that session expires.
            while not self._stopped.wait(0.2):
                if self.zk.exists(path) is None:
                    gone = True
                    break
                if time.monotonic() > deadline:
                    break
            if self._stopped.is_set():
                return
            if not gone:
                raise ZKError(
                    "registration node exists and belongs to another live session",
                    bookie=self.bookie_id,
                    path=path,
                )

    def _delete_if_owned(self, path: str) -> None:
        try:
            if self._owned(path):
                self.zk.delete(path)
        except KeyNotFound:
            pass


def _same(stored: Cookie, expected: Cookie) -> bool:
    """BookKeeper's Cookie.verify: everything but the layout version (and index dirs). A
    stored cookie without an instance id (written before the cluster had one) accepts any."""
    if stored.instance_id is not None and stored.instance_id != expected.instance_id:
        return False
    return (stored.bookie_host, stored.journal_dirs, stored.ledger_dirs) == (
        expected.bookie_host,
        expected.journal_dirs,
        expected.ledger_dirs,
    )
