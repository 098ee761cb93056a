"""Connections to many bookies by BookieId: an asyncio pool and a synchronous facade.

:class:`BookieClientPool` keeps one :class:`~bklib.client.connection.BookieConnection` per bookie
id, created on first use, with addresses resolved through ZooKeeper registrations
(:class:`~bklib.client.resolver.BookieAddressResolver`) and re-resolved after a failure.

:class:`SyncBookieClient` runs such a pool on an event loop in a private daemon thread so plain
threads and Spark executor tasks can call it. It has no module-level state, starts its thread
lazily, notices when it is used in a forked child (Spark's Python workers are forked) and starts
afresh there, and refuses to be pickled: ship a connect string or a :class:`ClientConfig` to the
executors and create one client per executor or per partition, e.g.::

    def audit_partition(rows):
        with SyncBookieClient(zk_connect, ledgers_root=DEFAULT_LEDGERS_ROOT) as client:
            for row in rows:
                yield client.read(row.bookie, row.ledger_id, row.entry_id)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, get_args

from kazoo.client import KazooClient

from bklib.client.connection import BookieConnection
from bklib.client.connection_v2 import BookieConnectionV2
from bklib.client.operations import TIMEOUTS, ClientConfig
from bklib.client.resolver import BookieAddressResolver
from bklib.errors import BKTimeoutError, ClientClosedError
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.states import DEFAULT_LEDGERS_ROOT
from bklib.tls import TlsContextSource, TlsSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
_F = TypeVar("_F", bound=Callable[..., Any])

WireProtocol = Literal["v2", "v3"]
"""How a pool talks to a bookie: v3 protobuf (bklib's default) or v2 binary (Pulsar's brokers)."""
WIRE_PROTOCOLS: tuple[WireProtocol, ...] = get_args(WireProtocol)
"""The choices of every ``--bookie-protocol``."""
DEFAULT_BOOKIE_PROTOCOL: WireProtocol = "v2"
"""What the audit's entry reads and the repair's copies speak unless told: v2, as Pulsar's
brokers do, costs client and bookie less per read than v3's protobuf (docs/benchmarks.md,
"The sample check on two cores")."""

# The pool and the blocking client derive their bookie operations from BookieConnection's
# methods, so each operation's parameters and documentation are written once, there.


def _with_bookie_id(op: Callable[..., Any]) -> inspect.Signature:
    """A connection method's signature as a pool method's: ``self``, then the bookie id."""
    sig = inspect.signature(op)
    this, *rest = sig.parameters.values()
    params = [
        this.replace(kind=inspect.Parameter.POSITIONAL_ONLY),
        inspect.Parameter("bookie_id", inspect.Parameter.POSITIONAL_ONLY, annotation="str"),
        *rest,
    ]
    return sig.replace(parameters=params)


def _on_bookie(
    op: Callable[Concatenate[BookieConnection, P], Awaitable[R]],
    v2_op: Callable[Concatenate[BookieConnectionV2, P], Awaitable[R]] | None = None,
) -> Callable[Concatenate[BookieClientPool, str, P], Coroutine[Any, Any, R]]:
    """The pool method running connection operation ``op`` on the connection to a bookie id, or
    ``v2_op`` (same parameters and result) on the v2 connection to a bookie the pool speaks v2
    to (:meth:`BookieClientPool.protocol_for`)."""

    if v2_op is None:

        async def method(
            self: BookieClientPool, bookie_id: str, /, *args: P.args, **kwargs: P.kwargs
        ) -> R:
            return await op(self.connection(bookie_id), *args, **kwargs)

    else:
        v2_method = v2_op

        async def method(
            self: BookieClientPool, bookie_id: str, /, *args: P.args, **kwargs: P.kwargs
        ) -> R:
            if self.protocol_for(bookie_id) == "v2":
                return await v2_method(self.connection_v2(bookie_id), *args, **kwargs)
            return await op(self.connection(bookie_id), *args, **kwargs)

    return _describe(
        method,
        op,
        "BookieClientPool",
        f":meth:`BookieConnection.{op.__name__}` on the bookie ``bookie_id``"
        + (f" (v2 bookies: :meth:`BookieConnectionV2.{op.__name__}`)." if v2_op else "."),
        _with_bookie_id(op),
    )


def _on_v2_bookie(
    op: Callable[Concatenate[BookieConnectionV2, P], Awaitable[R]],
) -> Callable[Concatenate[BookieClientPool, str, P], Coroutine[Any, Any, R]]:
    """The pool method running v2-only operation ``op`` on the v2 connection to a bookie id,
    whatever protocol the pool speaks to it otherwise."""

    async def method(
        self: BookieClientPool, bookie_id: str, /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        return await op(self.connection_v2(bookie_id), *args, **kwargs)

    return _describe(
        method,
        op,
        "BookieClientPool",
        f":meth:`BookieConnectionV2.{op.__name__}` on the bookie ``bookie_id`` (always v2).",
        _with_bookie_id(op),
    )


def _blocking(
    op: Callable[Concatenate[BookieClientPool, str, P], Awaitable[R]],
) -> Callable[Concatenate[SyncBookieClient, str, P], R]:
    """The SyncBookieClient method running pool operation ``op`` on the client's loop and waiting
    for it at most :meth:`SyncBookieClient.guard` of the operation's timeout."""
    name = op.__name__

    def method(self: SyncBookieClient, bookie_id: str, /, *args: P.args, **kwargs: P.kwargs) -> R:
        timeout = kwargs.get("timeout")
        if timeout is not None and not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
        # The connection resolves timeout=None from the same config, so the guard matches it.
        t = self.config.timeout_for(name, timeout)
        return self._wait(lambda p: op(p, bookie_id, *args, **kwargs), self.guard(t))

    return _describe(
        method,
        op,
        "SyncBookieClient",
        f"Blocking :meth:`BookieClientPool.{name}`.",
        inspect.signature(op),
    )


def _describe(
    fn: _F, op: Callable[..., Any], owner: str, summary: str, sig: inspect.Signature
) -> _F:
    fn.__name__ = op.__name__
    fn.__qualname__ = f"{owner}.{op.__name__}"
    fn.__doc__ = f"{summary}\n\n{inspect.getdoc(op) or ''}".rstrip()
    # help(), IDEs and inspect.signature() then show the operation's real parameters.
    fn.__dict__["__signature__"] = sig
    return fn


class BookieClientPool:
    """One lazily created connection per bookie id, on the running event loop.

    Give either a ``resolver`` or the arguments to build one (``zk``: an open metadata store,
    a started KazooClient, a store locator, or None for ``host:port`` ids only; ``zk_auth`` is
    how a ZooKeeper connect string's client authenticates: digest ``user:password`` or a
    ZkAccess). A resolver built here is
    closed by :meth:`close`; one passed in is not.

    ``protocol`` is the wire protocol of :meth:`read` and :meth:`add` (``"v2"``: what Pulsar's
    brokers speak), ``protocols`` overrides it per bookie id. The other operations are v3 only
    and :meth:`batch_read` is v2 only, whatever is chosen; a bookie may then have one connection
    of each protocol.

    ``tls`` (or ``config.tls``; ``tls`` wins) upgrades every connection, v3 and v2, with
    START_TLS; one SSL context is shared by all of them (rebuilt when a PEM file changes).
    """

    def __init__(
        self,
        zk: MetadataStore | KazooClient | str | None = None,
        *,
        ledgers_root: str = DEFAULT_LEDGERS_ROOT,
        config: ClientConfig | None = None,
        addresses: Mapping[str, tuple[str, int]] | None = None,
        legacy_fallback: bool = True,
        resolver: BookieAddressResolver | None = None,
        zk_auth: ZkAuth = None,
        protocol: WireProtocol = "v3",
        protocols: Mapping[str, WireProtocol] | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.config = config or ClientConfig()
        if tls is not None:
            self.config = dataclasses.replace(self.config, tls=tls)
        self._tls = (
            TlsContextSource(self.config.tls, "client") if self.config.tls is not None else None
        )
        self.protocol: WireProtocol = protocol
        self.protocols: dict[str, WireProtocol] = dict(protocols or {})
        for choice in (protocol, *self.protocols.values()):
            if choice not in WIRE_PROTOCOLS:
                raise ValueError(f"unknown bookie wire protocol {choice!r}")
        if resolver is None:
            resolver = BookieAddressResolver(
                zk,
                ledgers_root=ledgers_root,
                addresses=addresses,
                legacy_fallback=legacy_fallback,
                zk_timeout=self.config.connect_timeout,
                zk_auth=zk_auth,
            )
            self._owns_resolver = True
        else:
            self._owns_resolver = False
        self.resolver = resolver
        self._connections: dict[str, BookieConnection] = {}
        self._v2_connections: dict[str, BookieConnectionV2] = {}
        self._closed = False

    def protocol_for(self, bookie_id: str) -> WireProtocol:
        """The protocol :meth:`read` and :meth:`add` use with ``bookie_id``."""
        return self.protocols.get(bookie_id, self.protocol)

    def connection(self, bookie_id: str) -> BookieConnection:
        """The connection object for ``bookie_id`` (created, not yet connected, on first use)."""
        if self._closed:
            raise ClientClosedError("bookie client pool closed", bookie=bookie_id)
        conn = self._connections.get(bookie_id)
        if conn is None:
            conn = BookieConnection(
                bookie_id, self._resolver_for(bookie_id), self.config, tls=self._tls
            )
            self._connections[bookie_id] = conn
        return conn

    def connection_v2(self, bookie_id: str) -> BookieConnectionV2:
        """The v2 connection object for ``bookie_id`` (created, not yet connected, on first use)."""
        if self._closed:
            raise ClientClosedError("bookie client pool closed", bookie=bookie_id)
        conn = self._v2_connections.get(bookie_id)
        if conn is None:
            conn = BookieConnectionV2(
                bookie_id, self._resolver_for(bookie_id), self.config, tls=self._tls
            )
            self._v2_connections[bookie_id] = conn
        return conn

    def dedicated_connection_v2(self, bookie_id: str) -> BookieConnectionV2:
        """A new v2 connection to ``bookie_id`` that the pool does not keep: the caller closes
        it. For requests that may cost the connection (a BATCH_READ probe of a bookie that may
        predate it) without failing what is pipelined on the pool's own."""
        if self._closed:
            raise ClientClosedError("bookie client pool closed", bookie=bookie_id)
        return BookieConnectionV2(
            bookie_id, self._resolver_for(bookie_id), self.config, tls=self._tls
        )

    def _resolver_for(self, bookie_id: str) -> Callable[[bool], Awaitable[tuple[str, int]]]:
        resolver = self.resolver

        async def resolve(refresh: bool) -> tuple[str, int]:
            if not resolver.uses_zookeeper:
                return resolver.resolve(bookie_id, refresh=refresh)
            # kazoo blocks; keep the event loop (and every other bookie's traffic) running.
            call = functools.partial(resolver.resolve, bookie_id, refresh=refresh)
            return await asyncio.get_running_loop().run_in_executor(None, call)

        return resolve

    @property
    def bookie_ids(self) -> list[str]:
        """Bookies this pool has a connection object for (v3 or v2)."""
        return list(dict.fromkeys([*self._connections, *self._v2_connections]))

    # Each bookie operation of BookieConnection, on the connection to ``bookie_id``; read and add
    # on the v2 connection to bookies the pool speaks v2 to.
    add = _on_bookie(BookieConnection.add, BookieConnectionV2.add)
    read = _on_bookie(BookieConnection.read, BookieConnectionV2.read)
    read_many = _on_bookie(BookieConnection.read_many, BookieConnectionV2.read_many)
    read_lac = _on_bookie(BookieConnection.read_lac)
    write_lac = _on_bookie(BookieConnection.write_lac)
    force_ledger = _on_bookie(BookieConnection.force_ledger)
    list_entries = _on_bookie(BookieConnection.list_entries)
    bookie_info = _on_bookie(BookieConnection.bookie_info)
    batch_read = _on_v2_bookie(BookieConnectionV2.batch_read)

    async def disconnect(self, bookie_id: str) -> None:
        """Drop the connections to one bookie (they reconnect on the next request)."""
        for conn in (self._connections.get(bookie_id), self._v2_connections.get(bookie_id)):
            if conn is not None:
                await conn.disconnect()

    async def close(self) -> None:
        """Close every connection (outstanding requests fail with ClientClosedError) and the
        resolver if this pool built it."""
        self._closed = True
        conns = [*self._connections.values(), *self._v2_connections.values()]
        self._connections, self._v2_connections = {}, {}
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        if self._owns_resolver:
            if self.resolver.uses_zookeeper:
                await asyncio.get_running_loop().run_in_executor(None, self.resolver.close)
            else:
                self.resolver.close()

    async def __aenter__(self) -> BookieClientPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Runtime:
    """An event loop in a daemon thread and the pool living on it, owned by one process."""

    def __init__(self, make_pool: Callable[[], BookieClientPool], name: str) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.pool = make_pool()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    async def _aclose(self) -> None:
        await self.pool.close()
        # Calls still outstanding (waiting on a gate, a rate limit, a caller's own await) end
        # cancelled, so that nobody waits forever on a closed client's future.
        me = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not me]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        await self.loop.shutdown_default_executor()

    @staticmethod
    def shutdown(rt: _Runtime, timeout: float = 10.0) -> None:
        """Close the pool, stop the loop and join the thread. A static function so that
        ``weakref.finalize`` can call it without keeping the client alive."""
        if os.getpid() != rt.pid or rt.loop.is_closed():
            return  # inherited over fork: the thread is not ours to stop
        if rt.in_loop_thread():
            raise RuntimeError("SyncBookieClient.close() called from its own event-loop thread")
        if rt.thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(rt._aclose(), rt.loop)
            try:
                fut.result(timeout)
            except Exception as exc:  # noqa: BLE001 - closing goes on: the loop is stopped below
                log.warning("closing bookie client pool: %r", exc)
            rt.loop.call_soon_threadsafe(rt.loop.stop)
            rt.thread.join(timeout)
        if not rt.thread.is_alive():
            rt.loop.close()


async def _call(fn: Callable[[BookieClientPool], Awaitable[T]], pool: BookieClientPool) -> T:
    return await fn(pool)


def _chain(
    loop: asyncio.AbstractEventLoop, task: asyncio.Task[T], fut: concurrent.futures.Future[T]
) -> None:
    """Settle ``fut`` from ``task``, and cancel ``task`` when ``fut`` is cancelled, as
    :func:`asyncio.run_coroutine_threadsafe` does for one coroutine. ``fut`` stays pending until
    ``task`` ends, so that a cancel from another thread still takes."""

    def settle(t: asyncio.Task[T]) -> None:
        if t.cancelled():
            fut.cancel()
        if not fut.set_running_or_notify_cancel():
            return
        exc = t.exception()
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(t.result())

    def cancelled(f: concurrent.futures.Future[T]) -> None:
        if f.cancelled():
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(task.cancel)

    task.add_done_callback(settle)
    fut.add_done_callback(cancelled)


class SyncBookieClient:
    """Blocking bookie client for threads and Spark tasks; the asyncio pool runs in a private
    background thread. Methods mirror :class:`BookieClientPool` and raise the same bklib.errors.

    Thread-safe: many threads may call it at once and their requests are pipelined on the shared
    connections. Not picklable (it owns sockets and a thread): create one per executor process
    from a connect string. A client used in a forked child starts its own loop and connections
    there (one built on a KazooClient object cannot, as kazoo's threads do not survive fork).
    ``tls`` (or ``config.tls``) secures every bookie connection, as in :class:`BookieClientPool`.
    """

    def __init__(
        self,
        zk: MetadataStore | KazooClient | str | None = None,
        *,
        ledgers_root: str = DEFAULT_LEDGERS_ROOT,
        config: ClientConfig | None = None,
        addresses: Mapping[str, tuple[str, int]] | None = None,
        legacy_fallback: bool = True,
        protocol: WireProtocol = "v3",
        protocols: Mapping[str, WireProtocol] | None = None,
        zk_auth: ZkAuth = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self._zk = zk
        self._zk_auth = zk_auth
        self._protocol: WireProtocol = protocol
        self._protocols = dict(protocols or {})
        self._ledgers_root = ledgers_root
        self.config = config or ClientConfig()
        if tls is not None:
            self.config = dataclasses.replace(self.config, tls=tls)
        self._addresses = dict(addresses or {})
        self._legacy_fallback = legacy_fallback
        self._lock = threading.Lock()
        self._rt: _Runtime | None = None
        self._finalizer: weakref.finalize[[_Runtime, float], SyncBookieClient] | None = None
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "SyncBookieClient cannot be pickled (it owns sockets and a thread); pass the ZooKeeper "
            "connect string to your Spark tasks and create one client per executor/partition"
        )

    # ---- runtime -------------------------------------------------------------------------------

    def _make_pool(self) -> BookieClientPool:
        return BookieClientPool(
            self._zk,
            ledgers_root=self._ledgers_root,
            config=self.config,
            addresses=self._addresses,
            legacy_fallback=self._legacy_fallback,
            zk_auth=self._zk_auth,
            protocol=self._protocol,
            protocols=self._protocols,
        )

    def _drop_inherited_runtime(self) -> bool:
        """After fork, forget the parent's runtime; True if there was one.

        The parent's loop thread does not exist in the child and our lock may have been held at
        fork time, so both are abandoned rather than closed (closing would also touch sockets the
        parent still uses).
        """
        rt = self._rt
        if rt is None or rt.pid == os.getpid():
            return False
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = None
        self._rt = None
        self._lock = threading.Lock()
        return True

    def _runtime(self) -> _Runtime:
        rt = self._rt
        if rt is not None and rt.pid == os.getpid():
            return rt
        if self._drop_inherited_runtime() and isinstance(self._zk, (KazooClient, MetadataStore)):
            raise ClientClosedError(
                "SyncBookieClient built on an open store session cannot be used after fork; "
                "create it from a store locator instead"
            )
        with self._lock:
            if self._closed:
                raise ClientClosedError("bookie client closed")
            if self._rt is None:
                rt = _Runtime(self._make_pool, name=f"bookie-client-{id(self):x}")
                self._finalizer = weakref.finalize(self, _Runtime.shutdown, rt)
                self._rt = rt
            return self._rt

    def guard(self, op_timeout: float) -> float:
        """How long a blocking call waits for its coroutine. The coroutine bounds itself (connect,
        ZooKeeper and operation timeouts); this only protects against a wedged loop thread."""
        return op_timeout + 3 * self.config.connect_timeout + 5.0

    def _wait(self, coro_fn: Callable[[BookieClientPool], Awaitable[T]], guard: float | None) -> T:
        fut = self.submit(coro_fn)
        try:
            return fut.result(guard)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise BKTimeoutError(f"bookie client did not answer within {guard}s") from None
        except BaseException:
            fut.cancel()  # e.g. KeyboardInterrupt: do not leave the request running
            raise

    def submit(
        self, fn: Callable[[BookieClientPool], Awaitable[T]]
    ) -> concurrent.futures.Future[T]:
        """Run ``await fn(pool)`` on the client's loop and return a concurrent Future at once:
        how a plain thread pipelines many requests, e.g.
        ``[c.submit(lambda p, e=e: p.read(b, lid, e)) for e in ids]``."""
        return self.submit_many([fn])[0]

    def submit_many(
        self, fns: list[Callable[[BookieClientPool], Awaitable[T]]]
    ) -> list[concurrent.futures.Future[T]]:
        """:meth:`submit` for several calls at once, waking the loop thread once for all of
        them rather than once each (a checker starting a ledger's probes on every bookie).
        Cancelling a returned future cancels its call, as with :meth:`submit`."""
        rt = self._runtime()
        if rt.in_loop_thread():
            raise RuntimeError("blocking SyncBookieClient call from its own event-loop thread")
        out: list[concurrent.futures.Future[T]] = [concurrent.futures.Future() for _ in fns]
        if not out:
            return out  # nothing to start: do not wake the loop

        def start() -> None:
            for fn, fut in zip(fns, out, strict=True):
                if fut.cancelled():
                    # Cancelled before it started: notify, so wait() and as_completed() see it.
                    fut.set_running_or_notify_cancel()
                    continue
                # The future stays pending while its call runs, so that a cancel still takes.
                try:
                    task = rt.loop.create_task(_call(fn, rt.pool))
                except Exception as exc:  # noqa: BLE001 - handed to the caller's future below
                    # The caller gets the error from this future (never a silent result);
                    # the others still start.
                    if fut.set_running_or_notify_cancel():
                        fut.set_exception(exc)
                    continue
                _chain(rt.loop, task, fut)

        rt.loop.call_soon_threadsafe(start)
        return out

    def post(self, fn: Callable[[BookieClientPool], None]) -> None:
        """Call ``fn(pool)`` on the client's loop soon, without waiting and without a future:
        for a caller that hands work over in bulk and learns of its end its own way (the
        sampled check's reads, :mod:`bklib.audit.sampled_reads`). ``fn`` must not raise."""
        rt = self._runtime()
        rt.loop.call_soon_threadsafe(fn, rt.pool)

    def run(
        self, fn: Callable[[BookieClientPool], Awaitable[T]], timeout: float | None = None
    ) -> T:
        """``submit(fn)`` and wait for the result (``timeout`` None = as long as it takes)."""
        return self._wait(fn, timeout)

    def call(self, operation: str, bookie_id: str, *args: Any, **kwargs: Any) -> Any:
        """Run the bookie operation named ``operation`` (a key of
        :data:`~bklib.client.operations.TIMEOUTS`) on ``bookie_id`` and wait for it, for callers
        that pick the operation at run time; ``client.call("read", b, lid, 0)`` is
        ``client.read(b, lid, 0)``. The named methods below are the typed spelling."""
        if operation not in TIMEOUTS:
            raise AttributeError(f"no bookie operation {operation!r}")
        return getattr(self, operation)(bookie_id, *args, **kwargs)

    # ---- operations ----------------------------------------------------------------------------

    # Each one blocks on the pool method of the same name; see _blocking for the wait bound.
    add = _blocking(BookieClientPool.add)
    read = _blocking(BookieClientPool.read)
    read_many = _blocking(BookieClientPool.read_many)
    read_lac = _blocking(BookieClientPool.read_lac)
    write_lac = _blocking(BookieClientPool.write_lac)
    force_ledger = _blocking(BookieClientPool.force_ledger)
    list_entries = _blocking(BookieClientPool.list_entries)
    bookie_info = _blocking(BookieClientPool.bookie_info)
    batch_read = _blocking(BookieClientPool.batch_read)

    def disconnect(self, bookie_id: str) -> None:
        """Drop the connection to ``bookie_id``; the next request reconnects."""
        self._wait(lambda p: p.disconnect(bookie_id), self.guard(0))

    # ---- shutdown ------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self, timeout: float = 10.0) -> None:
        """Close every connection, stop the loop thread and the ZooKeeper client it started.
        Idempotent. Outstanding requests fail with ClientClosedError; other calls still
        running (from :meth:`submit`) are cancelled, so their futures end."""
        self._drop_inherited_runtime()
        with self._lock:
            self._closed = True
            rt, self._rt = self._rt, None
            fin, self._finalizer = self._finalizer, None
        if fin is not None:
            fin.detach()
        if rt is not None:
            _Runtime.shutdown(rt, timeout)

    def __enter__(self) -> SyncBookieClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
