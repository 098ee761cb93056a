"""The small ZooKeeper data formats of BookKeeper 4.17: LAYOUT, bookie registrations, cookies,
and the under-replication/autorecovery znodes. Pure bytes <-> value functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf import text_format
from google.protobuf.message import DecodeError, EncodeError, Message

from bklib.errors import BookieHandleNotAvailableError, CompatibilityError, CorruptMetadataError
from bklib.meta.paths import HIERARCHICAL_FACTORY
from bklib.meta.serde import split_java_lines
from bklib.proto.formats_pb2 import (
    AuditorVoteFormat,
    BookieServiceInfoFormat,
    CheckAllLedgersFormat,
    CookieFormat,
    LedgerRereplicationLayoutFormat,
    LockDataFormat,
    UnderreplicatedLedgerFormat,
)
from bklib.states import parse_host_port

# ---- LAYOUT ----------------------------------------------------------------------------------

LAYOUT_FORMAT_VERSION = 2
_LAYOUT_MIN_COMPAT_VERSION = 1


@dataclass(frozen=True)
class LedgerLayout:
    """The cluster's ``LAYOUT`` znode. In layout format 1, ``factory_class`` is a type name
    such as ``hierarchical`` or ``flat``."""

    format_version: int
    factory_class: str
    manager_version: int


DEFAULT_LAYOUT = LedgerLayout(LAYOUT_FORMAT_VERSION, HIERARCHICAL_FACTORY, 1)
DEFAULT_LAYOUT_DATA = b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"


def encode_layout(layout: LedgerLayout) -> bytes:
    """``<formatVersion>\\n<factoryClass>:<managerVersion>``, with no trailing newline."""
    return f"{layout.format_version}\n{layout.factory_class}:{layout.manager_version}".encode()


def parse_layout(data: bytes) -> LedgerLayout:
    """Parse LAYOUT like ``LedgerLayout.parseLayout``.

    Raises CompatibilityError for a layout format outside 1..2 and CorruptMetadataError for
    anything malformed.
    """
    text = _utf8(data, "LAYOUT")
    lines = _java_split(text, "\n")
    try:
        version = _java_int(lines[0] if lines else "")
    except ValueError:
        raise CorruptMetadataError(f"cannot parse LAYOUT {text!r}") from None
    if not _LAYOUT_MIN_COMPAT_VERSION <= version <= LAYOUT_FORMAT_VERSION:
        raise CompatibilityError(
            f"LAYOUT format version {version} not supported "
            f"(expected {_LAYOUT_MIN_COMPAT_VERSION} to {LAYOUT_FORMAT_VERSION})"
        )
    if len(lines) < 2:
        raise CorruptMetadataError(f"ledger manager and its version absent from LAYOUT {text!r}")
    parts = _java_split(lines[1], ":")
    if len(parts) != 2:
        raise CorruptMetadataError(f"invalid ledger manager in LAYOUT {text!r}")
    try:
        manager_version = _java_int(parts[1])
    except ValueError:
        raise CorruptMetadataError(f"cannot parse manager version in LAYOUT {text!r}") from None
    return LedgerLayout(version, parts[0], manager_version)


# ---- bookie registration (available/<bookieId>) ----------------------------------------------

BOOKIE_RPC_PROTOCOL = "bookie-rpc"


@dataclass(frozen=True)
class Endpoint:
    """One service a bookie publishes (``BookieServiceInfoFormat.Endpoint``)."""

    id: str
    port: int
    host: str
    protocol: str
    auth: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "auth", tuple(self.auth))
        object.__setattr__(self, "extensions", tuple(self.extensions))


@dataclass(frozen=True)
class BookieServiceInfo:
    """What a bookie publishes in its registration znode."""

    endpoints: tuple[Endpoint, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", tuple(self.endpoints))
        object.__setattr__(self, "properties", dict(self.properties))

    def rpc_address(self) -> tuple[str, int]:
        """(host, port) of the ``bookie-rpc`` endpoint, which clients connect to."""
        for ep in self.endpoints:
            if ep.protocol == BOOKIE_RPC_PROTOCOL:
                return ep.host, ep.port
        raise BookieHandleNotAvailableError("bookie does not publish a bookie-rpc endpoint")


def service_info_for(host: str, port: int, extensions: Iterable[str] = ()) -> BookieServiceInfo:
    """The registration a real 4.17 bookie publishes (HTTP server disabled)."""
    return BookieServiceInfo(
        (Endpoint("bookie", port, host, BOOKIE_RPC_PROTOCOL, (), tuple(extensions)),)
    )


def encode_service_info(info: BookieServiceInfo) -> bytes:
    """Raw binary ``BookieServiceInfoFormat`` (not length-delimited); no endpoints -> b""."""
    msg = BookieServiceInfoFormat()
    try:
        for ep in info.endpoints:
            msg.endpoints.add(
                id=ep.id,
                port=ep.port,
                host=ep.host,
                protocol=ep.protocol,
                auth=list(ep.auth),
                extensions=list(ep.extensions),
            )
        for key, value in info.properties.items():
            msg.properties[key] = value
        # Deterministic so equal infos give equal bytes (map order is otherwise unspecified).
        data: bytes = msg.SerializeToString(deterministic=True)
        return data
    except (EncodeError, ValueError, TypeError) as exc:
        raise CorruptMetadataError(f"cannot serialise bookie service info: {exc}") from None


def decode_service_info(data: bytes, bookie_id: str) -> BookieServiceInfo:
    """Parse registration data. Empty data is a pre-4.11 (or LocalBookKeeper) registration:
    the bookie id itself is read as ``host:port``, as BookKeeper's registration client does."""
    if not data:
        return _legacy_service_info(bookie_id)
    msg = BookieServiceInfoFormat()
    _parse_binary(msg, bytes(data), "bookie service info", bookie=bookie_id)
    try:
        properties = dict(msg.properties)
    except UnicodeDecodeError as exc:
        raise CorruptMetadataError(
            f"bookie service info property: {exc}", bookie=bookie_id
        ) from None
    return BookieServiceInfo(
        tuple(
            Endpoint(
                _pb_str(e.id),
                e.port,
                _pb_str(e.host),
                _pb_str(e.protocol),
                tuple(_pb_str(a) for a in e.auth),
                tuple(_pb_str(x) for x in e.extensions),
            )
            for e in msg.endpoints
        ),
        properties,
    )


def _legacy_service_info(bookie_id: str) -> BookieServiceInfo:
    # Empty registration data: the address is the id's, by the one host:port rule.
    address = parse_host_port(bookie_id)
    if address is None:
        raise CorruptMetadataError(
            "empty registration data and the bookie id is not host:port, so no address "
            "can be derived",
            bookie=bookie_id,
        )
    host, port = address
    return BookieServiceInfo((Endpoint(bookie_id, port, host, BOOKIE_RPC_PROTOCOL),))


# ---- cookies (cookies/<bookieId>) -------------------------------------------------------------

COOKIE_LAYOUT_VERSION = 5


@dataclass(frozen=True)
class Cookie:
    """A bookie's cookie. ``index_dirs`` is None when the bookie has no separate index dirs;
    ``instance_id`` is None when the cookie carries none."""

    layout_version: int
    bookie_host: str
    journal_dirs: list[str]
    ledger_dirs: list[str]
    instance_id: str | None = None
    index_dirs: list[str] | None = None


def encode_cookie(cookie: Cookie) -> bytes:
    """The current (layout 5) form: ``5`` on the first line, then the text CookieFormat."""
    msg = CookieFormat(
        bookieHost=cookie.bookie_host,
        journalDir=",".join(cookie.journal_dirs),
        ledgerDirs=_encode_dirs(cookie.ledger_dirs),
    )
    if cookie.instance_id is not None:
        msg.instanceId = cookie.instance_id
    if cookie.index_dirs is not None:
        msg.indexDirs = _encode_dirs(cookie.index_dirs)
    return f"{COOKIE_LAYOUT_VERSION}\n".encode() + _to_text(msg)


def parse_cookie(data: bytes) -> Cookie:
    """Parse a cookie: layout 4/5 text proto or legacy layout 3 plain lines."""
    text = _utf8(data, "cookie")
    first, *tail = split_java_lines(text, maxsplit=1)
    rest = tail[0] if tail else ""
    try:
        # Cookie.parse trims the version line (String.trim: every char <= ' ').
        layout = _java_int(first.strip("".join(map(chr, range(33)))))
    except ValueError:
        raise CorruptMetadataError(f"invalid cookie layout version line {first!r}") from None
    if layout == 3:
        lines = split_java_lines(rest)
        if len(lines) < 3:
            raise CorruptMetadataError("layout 3 cookie needs bookie id, journal and ledger dirs")
        return Cookie(3, lines[0], _split_journal(lines[1]), _decode_dirs(lines[2]))
    if layout < 3:
        raise CompatibilityError(f"cookie layout version {layout} is too old")
    msg = CookieFormat()
    _parse_text(msg, rest, "cookie")
    return Cookie(
        layout,
        msg.bookieHost,
        _split_journal(msg.journalDir),
        _decode_dirs(msg.ledgerDirs),
        # Cookie.parse treats an empty optional value like an absent one.
        msg.instanceId or None,
        _decode_dirs(msg.indexDirs) if msg.indexDirs else None,
    )


def _encode_dirs(dirs: Sequence[str]) -> str:
    return "\t".join([str(len(dirs)), *dirs])


def _decode_dirs(s: str) -> list[str]:
    # Like Cookie.decodeDirPathFromCookie, the leading count is skipped, not checked. Java
    # would return a tab-less value as one dir; a bare count is an empty list here instead.
    _count, tab, rest = s.partition("\t")
    return _java_split(rest, "\t") if tab else []


def _split_journal(s: str) -> list[str]:
    return s.split(",") if s else []


# ---- under-replication and autorecovery --------------------------------------------------------

UR_LAYOUT_TYPE = "BASIC"
UR_LAYOUT_VERSION = 1
UR_LAYOUT_DATA = b'type: "BASIC"\nversion: 1\n'


def check_ur_layout(data: bytes) -> None:
    """Raise CompatibilityError unless ``underreplication/LAYOUT`` is BASIC version 1."""
    msg = LedgerRereplicationLayoutFormat()
    try:
        text_format.Merge(_utf8(data, "underreplication LAYOUT"), msg)
    except (text_format.ParseError, ValueError, CorruptMetadataError) as exc:
        raise CompatibilityError(f"invalid underreplication LAYOUT: {exc}") from None
    missing = msg.FindInitializationErrors()
    if missing:
        raise CompatibilityError(f"underreplication LAYOUT lacks {', '.join(missing)}")
    if msg.type != UR_LAYOUT_TYPE or msg.version != UR_LAYOUT_VERSION:
        raise CompatibilityError(
            f"incompatible underreplication layout {msg.type}:{msg.version} "
            f"(expected {UR_LAYOUT_TYPE}:{UR_LAYOUT_VERSION})"
        )


def encode_ur_ledger(replicas: Sequence[str], ctime_ms: int | None) -> bytes:
    """Text UnderreplicatedLedgerFormat: the missing replicas, then the mark time if given."""
    msg = UnderreplicatedLedgerFormat(replica=list(replicas))
    if ctime_ms is not None:
        msg.ctime = ctime_ms
    return _to_text(msg)


def decode_ur_ledger(data: bytes) -> tuple[list[str], int | None]:
    """(missing replicas, mark time in ms or None) from an ``urL<id>`` znode."""
    msg = UnderreplicatedLedgerFormat()
    _parse_text(msg, _utf8(data, "under-replicated ledger"), "under-replicated ledger")
    return list(msg.replica), msg.ctime if msg.HasField("ctime") else None


def encode_lock_data(worker: str) -> bytes:
    """Text LockDataFormat for ``locks/urL<id>``: the worker's host name in ``bookieId``."""
    return _to_text(LockDataFormat(bookieId=worker))


def decode_lock_data(data: bytes) -> str:
    """The lock holder named in ``locks/urL<id>`` ("" if none)."""
    msg = LockDataFormat()
    _parse_text(msg, _utf8(data, "lock data"), "lock data")
    return msg.bookieId


def encode_auditor_vote(bookie_id: str) -> bytes:
    """Text AuditorVoteFormat, as written to ``auditorelection/V_...`` and its parent."""
    return _to_text(AuditorVoteFormat(bookieId=bookie_id))


def decode_auditor_vote(data: bytes) -> str:
    """The bookie id in an auditor vote ("" if none)."""
    msg = AuditorVoteFormat()
    _parse_text(msg, _utf8(data, "auditor vote"), "auditor vote")
    return msg.bookieId


PULSAR_AUDITOR_LEADER = "leader"
"""Pulsar's Auditor election key under ``underreplication`` (``PulsarLedgerAuditorManager``)."""


def encode_pulsar_leader(bookie_id: str) -> bytes:
    """The leader value Pulsar's ``LeaderElectionImpl`` writes: the bookie id as JSON."""
    return json.dumps(bookie_id).encode()


def decode_pulsar_leader(data: bytes) -> str:
    """The bookie id in Pulsar's Auditor leader key; text that is no JSON string is returned
    as it stands (it is only shown to the operator)."""
    text = data.decode("utf-8", errors="replace")
    try:
        value = json.loads(text)
    except ValueError:
        return text.strip()
    return value if isinstance(value, str) else text.strip()


def encode_check_ctime(ctime_ms: int) -> bytes:
    """Binary ``{1: int64}``, the shared wire form of CheckAllLedgersFormat,
    PlacementPolicyCheckFormat and ReplicasCheckFormat."""
    data: bytes = CheckAllLedgersFormat(checkAllLedgersCTime=ctime_ms).SerializeToString()
    return data


def decode_check_ctime(data: bytes) -> int:
    """The time in one of the ``*ctime`` znodes; -1 when unset, as BookKeeper reports it."""
    msg = CheckAllLedgersFormat()
    _parse_binary(msg, bytes(data), "check ctime")
    return msg.checkAllLedgersCTime if msg.HasField("checkAllLedgersCTime") else -1


# ---- helpers ----------------------------------------------------------------------------------


def _pb_str(value: str | bytes) -> str:
    # Python protobuf hands back bytes for a proto2 string that is not UTF-8; protobuf-java
    # decodes it with replacement characters.
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _to_text(msg: Message) -> bytes:
    # protobuf-java's printer escapes non-ASCII as octal UTF-8 bytes; Python's default
    # (as_utf8=True) would not.
    text: str = text_format.MessageToString(msg, as_utf8=False)
    return text.encode("ascii")


def _utf8(data: bytes, what: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptMetadataError(f"{what} is not UTF-8: {exc}") from None


def _parse_text(msg: Message, text: str, what: str) -> None:
    try:
        # Merge, as protobuf-java's TextFormat.merge: a repeated singular field overwrites.
        text_format.Merge(text, msg)
    except (text_format.ParseError, ValueError) as exc:
        raise CorruptMetadataError(f"unparsable {what}: {exc}") from None
    missing = msg.FindInitializationErrors()
    if missing:
        raise CorruptMetadataError(f"{what} lacks required field(s) {', '.join(missing)}")


def _parse_binary(msg: Message, data: bytes, what: str, bookie: str | None = None) -> None:
    try:
        msg.MergeFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise CorruptMetadataError(f"undecodable {what}: {exc}", bookie=bookie) from None
    missing = msg.FindInitializationErrors()
    if missing:
        raise CorruptMetadataError(
            f"{what} lacks required field(s) {', '.join(missing)}", bookie=bookie
        )


def _java_split(s: str, sep: str) -> list[str]:
    """Java's String.split with a literal separator: trailing empty strings are dropped."""
    if sep not in s:
        return [s]
    parts = s.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _java_int(s: str) -> int:
    """Integer.parseInt: optional sign and ASCII digits only, within int32."""
    body = s[1:] if s[:1] in ("+", "-") else s
    if not body or not body.isascii() or not body.isdigit():
        raise ValueError(f"not an integer: {s!r}")
    v = int(s)
    if not -(2**31) <= v < 2**31:
        raise ValueError(f"out of int range: {s}")
    return v
