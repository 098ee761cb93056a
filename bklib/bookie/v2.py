"""v2 ("PreV3") binary requests of the Python bookie; layouts and opcodes in :mod:`bklib.proto.v2`.

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
from bklib.proto.v2 import (
    ADD_ENTRY,
    AUTH,
    BATCH_READ_ENTRY,
    BATCH_READ_REQUEST,
    BATCH_RESPONSE_HEADER_SIZE,
    FLAG_DO_FENCING,
    FLAG_HIGH_PRIORITY,
    FLAG_RECOVERY_ADD,
    HEADER,
    IDS,
    LEN,
    MASTER_KEY_LENGTH,
    OP_NAMES,
    READ_ENTRY,
    encode_add_response,
    encode_batch_read_response,
    encode_read_response,
    packet_header,
)

log = logging.getLogger(__name__)

AUTH_DISABLED_PLUGIN = "AuthDisabledPlugin"

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
        if op not in OP_NAMES:
            conn.abort(f"unsupported v2 opcode {op} (version {version})")
            return
        if op == AUTH:
            self._v2_auth(conn, version)
            return
        ledger_id, entry_id, fence = _v2_target(op, frame)
        if self.faults is not None and self.faults.rules and ledger_id is not None:
            rule = self.faults.match(OP_NAMES[op], ledger_id, entry_id, fence)
            if rule is not None:
                self._apply_fault_v2(conn, frame, version, op, flags, rule)
                return
        self._dispatch_v2(conn, frame, version, op, flags)

    def _dispatch_v2(self, conn: Any, frame: bytes, version: int, op: int, flags: int) -> None:
        if op == ADD_ENTRY:
            self._v2_add(conn, frame, version, flags)
        elif op == READ_ENTRY:
            self._v2_read(conn, frame, version, flags)
        else:
            self._v2_batch_read(conn, frame, version, flags)

    def _apply_fault_v2(
        self, conn: Any, frame: bytes, version: int, op: int, flags: int, rule: FaultRule
    ) -> None:
        ledger_id, entry_id, _ = _v2_target(op, frame)
        assert ledger_id is not None and entry_id is not None

        def make_error(status: int) -> bytes:
            if op == BATCH_READ_ENTRY:
                _, start, request_id, _, _ = BATCH_READ_REQUEST.unpack_from(frame, 4)
                return encode_batch_read_response(
                    version, _V2_RC.get(status, _V2_EIO), ledger_id, start, request_id
                )
            encode = encode_add_response if op == ADD_ENTRY else encode_read_response
            return encode(version, _V2_RC.get(status, _V2_EIO), ledger_id, entry_id)

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
        if len(frame) < 4 + MASTER_KEY_LENGTH + 16:
            conn.abort(f"truncated v2 add ({len(frame)} bytes)")
            return
        body = frame[4 + MASTER_KEY_LENGTH :]
        ledger_id, entry_id = IDS.unpack_from(body, 0)
        if version > 2:
            conn.send_raw(encode_add_response(version, 103, ledger_id, entry_id))
            return
        status, seq = self._add(
            body,
            frame[4 : 4 + MASTER_KEY_LENGTH],
            bool(flags & FLAG_RECOVERY_ADD),
            bool(flags & FLAG_HIGH_PRIORITY),
        )
        data = encode_add_response(version, _V2_RC[status], ledger_id, entry_id)
        if status != EOK or self.journal.is_durable(seq):
            conn.send_raw(data)
            return

        def done(exc: BaseException | None) -> None:
            if exc is None:
                conn.send_raw(data)
            else:
                conn.send_raw(encode_add_response(version, _V2_EIO, ledger_id, entry_id))

        self.journal.when_durable(seq, done)

    def _v2_read(self, conn: Any, frame: bytes, version: int, flags: int) -> None:
        ledger_id, entry_id = IDS.unpack_from(frame, 4)

        def reply(status: int, body: bytes = b"") -> bytes:
            return encode_read_response(version, _V2_RC[status], ledger_id, entry_id, body)

        if version > 2:
            conn.send_raw(reply(pb.EBADVERSION))
            return
        if not flags & FLAG_DO_FENCING:
            status, body, _ = self._read(ledger_id, entry_id)
            conn.send_raw(reply(status, body or b""))
            return
        if version < 2:
            conn.send_raw(reply(EUA))  # no key field before version 2
            return
        if len(frame) < 20 + MASTER_KEY_LENGTH:
            conn.abort(f"truncated v2 fencing read of ledger {ledger_id} (no master key)")
            return
        status, state, seq = self._fence(ledger_id, frame[20 : 20 + MASTER_KEY_LENGTH])
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
        ledger_id, start, request_id, max_count, max_size = BATCH_READ_REQUEST.unpack_from(frame, 4)

        def reply(status: int, bodies: list[bytes]) -> bytes:
            return encode_batch_read_response(
                version, _V2_RC[status], ledger_id, start, request_id, bodies
            )

        if version > 2:
            conn.send_raw(reply(pb.EBADVERSION, []))
            return
        seq = 0
        if flags & FLAG_DO_FENCING:
            if version < 2:
                conn.send_raw(reply(EUA, []))
                return
            if len(frame) < 40 + MASTER_KEY_LENGTH:
                conn.abort(f"truncated v2 fencing batch read of ledger {ledger_id}")
                return
            status, state, seq = self._fence(ledger_id, frame[40 : 40 + MASTER_KEY_LENGTH])
            if state is None:
                conn.send_raw(reply(status, []))
                return
        status, body, _ = self._read(ledger_id, start)
        if status != EOK or body is None:
            conn.send_raw(reply(status, []))
            return
        bodies = [body]
        limit = (
            min(max_size if max_size > 0 else self.max_frame, self.max_frame)
            - 4
            - BATCH_RESPONSE_HEADER_SIZE
        )
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

    def refuse_v2(self, conn: Any, frame: bytes) -> bool:
        """Answer a v2 ADD, READ or BATCH_READ with EUA (a TLS bookie before START_TLS);
        False, untouched, for AUTH and for what :meth:`handle_v2` rejects anyway."""
        if len(frame) < 4 or frame[0] == 0:
            return False
        version, op = frame[0], frame[1]
        rc = V3_TO_V2[EUA]
        if op == BATCH_READ_ENTRY:
            ledger_id, start, request_id, _, _ = BATCH_READ_REQUEST.unpack_from(frame, 4)
            conn.send_raw(encode_batch_read_response(version, rc, ledger_id, start, request_id))
        elif op == ADD_ENTRY:
            ledger_id, entry_id = IDS.unpack_from(frame, 4 + MASTER_KEY_LENGTH)
            conn.send_raw(encode_add_response(version, rc, ledger_id, entry_id))
        elif op == READ_ENTRY:
            ledger_id, entry_id = IDS.unpack_from(frame, 4)
            conn.send_raw(encode_read_response(version, rc, ledger_id, entry_id))
        else:
            return False
        return True

    def _v2_auth(self, conn: Any, version: int) -> None:
        msg = pb.AuthMessage(authPluginName=AUTH_DISABLED_PLUGIN, payload=b"").SerializeToString()
        conn.send_raw(LEN.pack(4 + len(msg)) + HEADER.pack(packet_header(version, AUTH)) + msg)


def _v2_target(op: int, frame: bytes) -> tuple[int | None, int | None, bool]:
    """(ledger, entry, fence) a v2 request is about, for fault matching (None if truncated)."""
    try:
        if op == ADD_ENTRY:
            lid, eid = IDS.unpack_from(frame, 4 + MASTER_KEY_LENGTH)
            return lid, eid, False
        if op in (READ_ENTRY, BATCH_READ_ENTRY):
            lid, eid = IDS.unpack_from(frame, 4)
            fence = frame[0] != 0 and bool(frame[3] & FLAG_DO_FENCING)
            return lid, eid, fence
    except struct.error:
        pass
    return None, None, False
