"""What the bookie operations of both wire protocols share: the client configuration with each
operation's default timeout (BookKeeper's ``ClientConfiguration``), the registry of operations
and the result of a read.

The v3 operations live in :mod:`bklib.client.connection`, the v2 ones in
:mod:`bklib.client.connection_v2`; both register here with :func:`bookie_operation`, and the
pool (:mod:`bklib.client.pool`) derives its per-bookie methods from the registries.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from bklib.proto.framing import MAX_FRAME_SIZE
from bklib.tls import TlsSettings

__all__ = ["TIMEOUTS", "ClientConfig", "ReadResult", "bookie_operation"]


@dataclass(frozen=True)
class ClientConfig:
    """Timeouts and limits of a bookie client; picklable, so it can be shipped to executors.

    Defaults follow BookKeeper's ``ClientConfiguration``.
    """

    add_timeout: float = 5.0  # addEntryTimeoutSec
    read_timeout: float = 5.0  # readEntryTimeoutSec: read, read LAC, write LAC, force, list
    bookie_info_timeout: float = 5.0  # getBookieInfoTimeoutSecs
    connect_timeout: float = 10.0  # clientConnectTimeoutMillis
    max_frame_size: int = MAX_FRAME_SIZE  # nettyMaxFrameSizeBytes, both directions
    reconnect_backoff_initial: float = 0.1  # first delay after a failed connect
    reconnect_backoff_max: float = 10.0  # cap of the doubling delay
    tls: TlsSettings | None = None  # tlsProviderFactoryClass set: START_TLS on every connection

    def timeout_for(self, operation: str, timeout: float | None = None) -> float:
        """``timeout`` if given, else the configured default of the bookie operation named
        ``operation`` (a key of :data:`TIMEOUTS`)."""
        if timeout is not None:
            return timeout
        default: float = getattr(self, TIMEOUTS[operation])
        return default


def run_client_config(
    *,
    read_timeout: float,
    connect_timeout: float = ClientConfig.connect_timeout,
    tls: TlsSettings | None = None,
) -> ClientConfig:
    """The bookie client configuration of a bkaudit run's requests (an audit's checks and
    capability probe, a repair's copies), the same in every executor and process: the run's
    timeouts, a short reconnect back-off (a dead bookie is retried soon, not hammered: the
    run's other bookies wait on nothing), and the run's bookie TLS (None: plaintext)."""
    return ClientConfig(
        read_timeout=read_timeout,
        connect_timeout=connect_timeout,
        reconnect_backoff_initial=0.05,
        reconnect_backoff_max=1.0,
        tls=tls,
    )


TIMEOUTS: dict[str, str] = {}
"""Every registered bookie operation, of the v3 connection
(:data:`bklib.client.connection.OPERATIONS`) and of the v2 one
(:data:`bklib.client.connection_v2.V2_OPERATIONS`), with its default-timeout field."""

_Op = TypeVar("_Op", bound=Callable[..., Awaitable[Any]])


def bookie_operation(timeout_field: str, registry: dict[str, str]) -> Callable[[_Op], _Op]:
    """Register a bookie coroutine method in ``registry`` (one per protocol:
    :data:`~bklib.client.connection.OPERATIONS`,
    :data:`~bklib.client.connection_v2.V2_OPERATIONS`) and :data:`TIMEOUTS`; its keyword-only
    ``timeout=None`` stands for ``ClientConfig.<timeout_field>``. One name has one timeout field
    in every registry."""
    if timeout_field not in {f.name for f in dataclasses.fields(ClientConfig)}:
        raise TypeError(f"ClientConfig has no field {timeout_field!r}")

    def register(fn: _Op) -> _Op:
        # The blocking client finds the timeout among the keyword arguments to size its guard.
        param = inspect.signature(fn).parameters.get("timeout")
        if param is None or param.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"bookie operation {fn.__name__} needs a keyword-only timeout")
        if TIMEOUTS.setdefault(fn.__name__, timeout_field) != timeout_field:
            raise TypeError(f"bookie operation {fn.__name__} registered with another timeout")
        registry[fn.__name__] = timeout_field
        return fn

    return register


@dataclass(frozen=True)
class ReadResult:
    """A successful read: the stored entry bytes (bklib.digest layout, digest not yet verified) and
    the bookie's known LAC when it reported one (``ReadResponse.maxLAC``; fence reads omit it)."""

    body: bytes
    max_lac: int | None = None
