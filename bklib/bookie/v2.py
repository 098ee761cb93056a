"""v2 ("PreV3") binary requests of the Python bookie (BookKeeper's ``BookieProtocol`` layouts).

Supported: ADD (1), READ (2, fencing included), AUTH (3, answered as auth-disabled) and
BATCH_READ (7). Replies echo the request's version byte and the ids the Java v2 client
matches on (a read of entry -1 answers with entry id -1). READ_LAC, WRITE_LAC and
GET_BOOKIE_INFO (4..6) are rejected by closing the connection, as the Java bookie's v2
decoder does; so are truncated requests. Versions above 2 get EBADVERSION.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from bklib.bookie.faults import FaultInjector, FaultRule, FaultyConnection
from bklib.bookie.journal import Journal
from bklib.bookie.storage import LedgerState
from bklib.proto import protocol_pb2 as pb
from bklib.proto.status import V3_TO_V2

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
_IDS = struct.Struct(">qq")
# length, header, rc, ledgerId, entryId: ADD replies, READ replies before the body.
_V2_ADD_RESP = struct.Struct(">Iiiqq")
_V2_READ_HDR = _V2_ADD_RESP
_V2_BATCH_REQ = struct.Struct(">qqqiq")  # ledgerId, startEntryId, requestId, maxCount, maxSize
_V2_BATCH_HDR = struct.Struct(">Iiiqqq")  # length, header, rc, ledgerId, startEntryId, requestId

AUTH_DISABLED_PLUGIN = "AuthDisabledPlugin"

V2_ADD, V2_READ, V2_AUTH, V2_BATCH_READ = 1, 2, 3, 7
V2_FLAG_FENCE, V2_FLAG_RECOVERY, V2_FLAG_HIGH_PRIORITY = 0x1, 0x2, 0x4
V2_MASTER_KEY_LEN = 20
_V2_OP_NAMES = {
    V2_ADD: "ADD_ENTRY",
    V2_READ: "READ_ENTRY",
    V2_AUTH: "AUTH",
    V2_BATCH_READ: "BATCH_READ_ENTRY",
}

# Java's v2 client cannot decode 107 (EUNKNOWNLEDGERSTATE); such answers go out as EIO.
_V2_RC = {**V3_TO_V2, pb.EUNKNOWNLEDGERSTATE: V3_TO_V2[pb.EIO]}
_V2_EIO = V3_TO_V2[pb.EIO]

EOK, EIO, EUA = pb.EOK, pb.EIO, pb.EUA


class V2Handlers:
    """Mixin of :class:`bklib.bookie.server.BookieServer` with the v2 request handlers."""

    journal: Journal
    faults: FaultInjector | None
    loop: asyncio.AbstractEventLoop
    max_frame: int

    def _add(self, body: bytes, key: bytes, recovery: bool, high_priority: bool) -> tuple[int, int]:
        raise NotImplementedError

    def _read(self, ledger_id: int, entry_id: int) -> tuple[int, bytes | None, LedgerState | None]:
        raise NotImplementedError

    def _fence(self, ledger_id: int, key: bytes) -> tuple[int, LedgerState | None, int]:
        raise NotImplementedError

    def handle_v2(self, conn: Any, frame: bytes) -> None:
        """One v2 binary request (BookKeeper's ``BookieProtocol``); struct.error means truncated."""
        if len(frame) < 4:
            conn.abort(f"v2 frame of {len(frame)} bytes has no header")
            return
        version = frame[0]
        if version == 0:
            # Legacy version 0: the whole header int is the opcode, flags are 0.
            (op,) = struct.unpack_from(">i", frame, 0)
            flags = 0
        else:
            op = frame[1]
            flags = (frame[2] << 8) | frame[3]
        if op not in _V2_OP_NAMES:
            conn.abort(f"unsupported v2 opcode {op} (version {version})")
            return
        if op == V2_AUTH:
            self._v2_auth(conn, version)
            return
        ledger_id, entry_id, fence = _v2_target(op, frame)
        if self.faults is not None and self.faults.rules and ledger_id is not None:
            rule = self.faults.match(_V2_OP_NAMES[op], ledger_id, entry_id, fence)
            if rule is not None:
                self._apply_fault_v2(conn, frame, version, op, flags, rule)
                return
        self._dispatch_v2(conn, frame, version, op, flags)

    def _dispatch_v2(self, conn: Any, frame: bytes, version: int, op: int, flags: int) -> None:
        if op == V2_ADD:
            self._v2_add(conn, frame, version, flags)
        elif op == V2_READ:
            self._v2_read(conn, frame, version, flags)
        else:
            self._v2_batch_read(conn, frame, version, flags)

    def _apply_fault_v2(
        self, conn: Any, frame: bytes, version: int, op: int, flags: int, rule: FaultRule
    ) -> None:
        ledger_id, entry_id, _ = _v2_target(op, frame)
        assert ledger_id is not None and entry_id is not None

        def make_error(status: int) -> bytes:
            if op == V2_BATCH_READ:
                _, start, request_id, _, _ = _V2_BATCH_REQ.unpack_from(frame, 4)
                return _V2_BATCH_HDR.pack(
                    32,
                    _v2_header(version, op),
                    _V2_RC.get(status, _V2_EIO),
                    ledger_id,
                    start,
                    request_id,
                )
            return _V2_ADD_RESP.pack(
                24, _v2_header(version, op), _V2_RC.get(status, _V2_EIO), ledger_id, entry_id
            )

        if rule.after:
            faulty = FaultyConnection(conn, rule, make_error, v2=True)
            self._dispatch_v2(faulty, frame, version, op, flags)
        elif rule.action == "delay":
            self.loop.call_later(
                rule.delay_ms / 1000, self._dispatch_v2, conn, frame, version, op, flags
            )
        elif rule.action == "fail":
            conn.send_raw(make_error(rule.status))

    def _v2_add(self, conn: Any, frame: bytes, version: int, flags: int) -> None:
        if len(frame) < 4 + V2_MASTER_KEY_LEN + 16:
            conn.abort(f"truncated v2 add ({len(frame)} bytes)")
            return
        body = frame[4 + V2_MASTER_KEY_LEN :]
        ledger_id, entry_id = _IDS.unpack_from(body, 0)
        header = _v2_header(version, V2_ADD)
        if version > 2:
            conn.send_raw(_V2_ADD_RESP.pack(24, header, 103, ledger_id, entry_id))
            return
        status, seq = self._add(
            body,
            frame[4 : 4 + V2_MASTER_KEY_LEN],
            bool(flags & V2_FLAG_RECOVERY),
            bool(flags & V2_FLAG_HIGH_PRIORITY),
        )
        data = _V2_ADD_RESP.pack(24, header, _V2_RC[status], ledger_id, entry_id)
        if status != EOK or self.journal.is_durable(seq):
            conn.send_raw(data)
            return

        def done(exc: BaseException | None) -> None:
            if exc is None:
                conn.send_raw(data)
            else:
                conn.send_raw(_V2_ADD_RESP.pack(24, header, _V2_RC[EIO], ledger_id, entry_id))

        self.journal.when_durable(seq, done)

    def _v2_read(self, conn: Any, frame: bytes, version: int, flags: int) -> None:
        ledger_id, entry_id = _IDS.unpack_from(frame, 4)
        header = _v2_header(version, V2_READ)

        def reply(status: int, body: bytes = b"") -> bytes:
            return (
                _V2_READ_HDR.pack(24 + len(body), header, _V2_RC[status], ledger_id, entry_id)
                + body
            )

        if version > 2:
            conn.send_raw(reply(pb.EBADVERSION))
            return
        if not flags & V2_FLAG_FENCE:
            status, body, _ = self._read(ledger_id, entry_id)
            conn.send_raw(reply(status, body or b""))
            return
        if version < 2:
            conn.send_raw(reply(EUA))  # no key field before version 2
            return
        if len(frame) < 20 + V2_MASTER_KEY_LEN:
            conn.abort(f"truncated v2 fencing read of ledger {ledger_id} (no master key)")
            return
        status, state, seq = self._fence(ledger_id, frame[20 : 20 + V2_MASTER_KEY_LEN])
        if state is None:
            conn.send_raw(reply(status))
            return
        status, body, _ = self._read(ledger_id, entry_id)
        if status != EOK or body is None:
            conn.send_raw(reply(status))
            return
        data = reply(EOK, body)
        if self.journal.is_durable(seq):
            conn.send_raw(data)
        else:
            self.journal.when_durable(
                seq, lambda exc: conn.send_raw(data if exc is None else reply(EIO))
            )

    def _v2_batch_read(self, conn: Any, frame: bytes, version: int, flags: int) -> None:
        ledger_id, start, request_id, max_count, max_size = _V2_BATCH_REQ.unpack_from(frame, 4)
        header = _v2_header(version, V2_BATCH_READ)

        def reply(status: int, bodies: list[bytes]) -> bytes:
            payload = b"".join(_LEN.pack(len(b)) + b for b in bodies)
            return (
                _V2_BATCH_HDR.pack(
                    32 + len(payload), header, _V2_RC[status], ledger_id, start, request_id
                )
                + payload
            )

        if version > 2:
            conn.send_raw(reply(pb.EBADVERSION, []))
            return
        seq = 0
        if flags & V2_FLAG_FENCE:
            if version < 2:
                conn.send_raw(reply(EUA, []))
                return
            if len(frame) < 40 + V2_MASTER_KEY_LEN:
                conn.abort(f"truncated v2 fencing batch read of ledger {ledger_id}")
                return
            status, state, seq = self._fence(ledger_id, frame[40 : 40 + V2_MASTER_KEY_LEN])
            if state is None:
                conn.send_raw(reply(status, []))
                return
        status, body, _ = self._read(ledger_id, start)
        if status != EOK or body is None:
            conn.send_raw(reply(status, []))
            return
        bodies = [body]
        limit = min(max_size if max_size > 0 else self.max_frame, self.max_frame) - 4 - 32
        size = 4 + len(body)
        eid = start + 1
        while max_count <= 0 or len(bodies) < max_count:
            status, body, _ = self._read(ledger_id, eid)
            if status != EOK or body is None or size + 4 + len(body) > limit:
                break
            bodies.append(body)
            size += 4 + len(body)
            eid += 1
        data = reply(EOK, bodies)
        if self.journal.is_durable(seq):
            conn.send_raw(data)
        else:
            self.journal.when_durable(
                seq, lambda exc: conn.send_raw(data if exc is None else reply(EIO, []))
            )

    def _v2_auth(self, conn: Any, version: int) -> None:
        msg = pb.AuthMessage(authPluginName=AUTH_DISABLED_PLUGIN, payload=b"").SerializeToString()
        conn.send_raw(
            _LEN.pack(4 + len(msg)) + struct.pack(">i", _v2_header(version, V2_AUTH)) + msg
        )


def _v2_header(version: int, op: int) -> int:
    """The header int of a v2 reply: the request's version, the opcode, flags 0."""
    if version == 0:
        return op
    return (version << 24) | (op << 16)


def _v2_target(op: int, frame: bytes) -> tuple[int | None, int | None, bool]:
    """(ledger, entry, fence) a v2 request is about, for fault matching (None if truncated)."""
    try:
        if op == V2_ADD:
            lid, eid = _IDS.unpack_from(frame, 4 + V2_MASTER_KEY_LEN)
            return lid, eid, False
        if op in (V2_READ, V2_BATCH_READ):
            lid, eid = _IDS.unpack_from(frame, 4)
            fence = frame[0] != 0 and bool(frame[3] & V2_FLAG_FENCE)
            return lid, eid, fence
    except struct.error:
        pass
    return None, None, False
