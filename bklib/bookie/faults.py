"""Fault injection and the local admin port of the Python bookie (tests and the sandbox).

Off by default. ``python -m bklib.bookie ... --fault-injection [--admin-port P]`` (or
``BookieConfig(fault_injection=True)``) starts a tiny admin server on 127.0.0.1 (port P,
default: any free port). Its address is written to ``<data_dir>/admin.json`` as
``{"host": "127.0.0.1", "port": P}`` before the bookie port accepts connections, so once the
bookie answers, :meth:`AdminClient.for_data_dir` finds it.

Protocol: one JSON object per line in, one JSON object per line out,
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. A command's reply is sent only
after it has taken effect, so tests need no sleeps. Commands:

==================  ========================================================================
``ping``            liveness
``status``          ``{"bookie_id", "port", "readonly", "ledgers", "faults": [...]}``
``add_fault``       ``{"rule": {...}}`` -> ``{"id": n}``; rule fields below
``set_faults``      ``{"rules": [{...}, ...]}`` replaces all rules -> ``{"ids": [...]}``
``clear_faults``    removes all rules
``set_readonly``    ``{"readonly": bool}``; replies after registration moved
``delete_entries``  ``{"ledger": L, "entries": [...]}`` -> ``{"deleted": [...]}`` (durable)
``corrupt_entry``   ``{"ledger": L, "entry": E, "offset": -1}`` flips one stored byte
``zk_session``      ``{"session_id": int, "password": hex}`` of the registration session
==================  ========================================================================

A fault rule (:class:`FaultRule`) matches requests by operation name (``ADD_ENTRY``,
``READ_ENTRY``, ``READ_LAC``, ``WRITE_LAC``, ``FORCE_LEDGER``, ``GET_BOOKIE_INFO``,
``GET_LIST_OF_ENTRIES_OF_LEDGER``, ``BATCH_READ_ENTRY``, ``AUTH``; v2 ADD/READ count as
ADD_ENTRY/READ_ENTRY), optionally ledger id, an inclusive entry-id range and whether the
read is a fencing read; the first matching rule applies:

* ``"action": "delay"`` waits ``delay_ms`` before processing (or, with ``"after": true``,
  processes at once and delays the reply);
* ``"action": "drop"`` never answers (``after: false``: not processed either, e.g. an add
  that never reached the bookie; ``after: true``: processed, reply lost);
* ``"action": "fail"`` answers with ``status`` (a StatusCode name or number, default EIO)
  without processing (``after: true``: processed, then the error is sent instead).

``count`` limits how many requests a rule applies to (then it is spent); ``hits`` counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bklib.errors import BKError
from bklib.proto import protocol_pb2 as pb

log = logging.getLogger(__name__)

ADMIN_FILE = "admin.json"
ACTIONS = ("delay", "drop", "fail")


class AdminError(BKError):
    """The admin command failed (reported by the bookie or the connection)."""


@dataclass
class FaultRule:
    """One fault rule; see the module docstring."""

    action: str
    ops: tuple[str, ...] | None = None
    ledger: int | None = None
    first_entry: int | None = None
    last_entry: int | None = None
    fence: bool | None = None
    status: int = pb.EIO
    delay_ms: int = 0
    after: bool = False
    count: int | None = None
    hits: int = 0
    id: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FaultRule:
        """Validate and build a rule from its JSON form (unknown keys are an error)."""
        d = dict(d)
        action = d.pop("action", None)
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, not {action!r}")
        ops = d.pop("ops", d.pop("op", None))
        if isinstance(ops, str):
            ops = [ops]
        if ops is not None:
            ops = tuple(str(o).upper() for o in ops)
            for o in ops:
                pb.OperationType.Value(o)  # ValueError for an unknown name
        entries = d.pop("entries", None)
        first = d.pop("first_entry", None)
        last = d.pop("last_entry", None)
        entry = d.pop("entry", None)
        if entry is not None:
            first = last = int(entry)
        if entries is not None:
            first, last = int(entries[0]), int(entries[1])
        ledger = d.pop("ledger", None)
        count = d.pop("count", None)
        status = d.pop("status", pb.EIO)
        if isinstance(status, str):
            status = pb.StatusCode.Value(status.upper())
        rule = cls(
            action=action,
            ops=ops,
            ledger=None if ledger is None else int(ledger),
            first_entry=None if first is None else int(first),
            last_entry=None if last is None else int(last),
            fence=d.pop("fence", None),
            status=int(status),
            delay_ms=int(d.pop("delay_ms", 0)),
            after=bool(d.pop("after", False)),
            count=None if count is None else int(count),
        )
        if d:
            raise ValueError(f"unknown fault rule fields {sorted(d)}")
        return rule

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ops"] = list(self.ops) if self.ops is not None else None
        return out

    def matches(self, op: str, ledger: int | None, entry: int | None, fence: bool) -> bool:
        if self.ops is not None and op not in self.ops:
            return False
        if self.ledger is not None and ledger != self.ledger:
            return False
        if self.first_entry is not None and (entry is None or entry < self.first_entry):
            return False
        if self.last_entry is not None and (entry is None or entry > self.last_entry):
            return False
        return self.fence is None or self.fence == fence


class FaultInjector:
    """The live rule set of one bookie."""

    def __init__(self) -> None:
        self.rules: list[FaultRule] = []
        self._ids = itertools.count(1)

    def add(self, rule: FaultRule) -> int:
        rule.id = next(self._ids)
        self.rules.append(rule)
        log.warning("fault injection: rule %d added: %s", rule.id, rule.to_json())
        return rule.id

    def clear(self) -> None:
        self.rules.clear()
        log.warning("fault injection: all rules cleared")

    def match(
        self, op: str, ledger: int | None, entry: int | None, fence: bool = False
    ) -> FaultRule | None:
        """The first live rule matching this request (its hit is counted), or None."""
        for rule in self.rules:
            if rule.count is not None and rule.hits >= rule.count:
                continue
            if rule.matches(op, ledger, entry, fence):
                rule.hits += 1
                log.info(
                    "fault injection: rule %d (%s) hits %s ledger %s entry %s",
                    rule.id,
                    rule.action,
                    op,
                    ledger,
                    entry,
                )
                return rule
        return None


class FaultyConnection:
    """Stands in for a Connection to apply an ``after`` fault rule to one reply."""

    def __init__(
        self, conn: Any, rule: FaultRule, make_error: Callable[[int], bytes], v2: bool
    ) -> None:
        self.conn = conn
        self.rule = rule
        self.make_error = make_error
        self.v2 = v2

    @property
    def closed(self) -> bool:
        return bool(self.conn.closed)

    def _deliver(self, data: bytes) -> None:
        rule = self.rule
        if rule.action == "drop":
            return
        if rule.action == "fail":
            data = self.make_error(rule.status)
        send = self.conn.send_raw if self.v2 else self.conn.send
        if rule.action == "delay":
            self.conn.server.loop.call_later(rule.delay_ms / 1000, send, data)
        else:
            send(data)

    def send(self, message: bytes) -> None:
        self._deliver(message)

    def send_raw(self, framed: bytes) -> None:
        self._deliver(framed)

    def abort(self, reason: str) -> None:
        self.conn.abort(reason)


AdminHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class AdminServer:
    """Line-delimited JSON commands on a loopback port, dispatched to ``handlers``."""

    def __init__(self, handlers: dict[str, AdminHandler], name: str) -> None:
        self.handlers = handlers
        self.name = name
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, port: int = 0, data_dir: Path | None = None) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        if data_dir is not None:
            tmp = Path(data_dir) / (ADMIN_FILE + ".tmp")
            tmp.write_text(json.dumps({"host": "127.0.0.1", "port": self.port}))
            tmp.replace(Path(data_dir) / ADMIN_FILE)
        log.warning("bookie %s: admin/fault-injection port 127.0.0.1:%d", self.name, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    cmd = json.loads(line)
                    handler = self.handlers.get(cmd.get("cmd"))
                    if handler is None:
                        raise ValueError(f"unknown admin command {cmd.get('cmd')!r}")
                    reply = {"ok": True, **(await handler(cmd))}
                except Exception as exc:  # noqa: BLE001 - the test harness reads ok: false, never a dropped reply
                    log.warning("bookie %s: admin command failed: %s", self.name, exc)
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


class AdminClient:
    """Blocking client of a bookie's admin port (tests, sandbox)."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.address = (host, port)
        self.timeout = timeout

    @classmethod
    def for_data_dir(cls, data_dir: str | Path, timeout: float = 30.0) -> AdminClient:
        """The admin port a bookie with this data dir published in ``admin.json``."""
        info = json.loads((Path(data_dir) / ADMIN_FILE).read_text())
        return cls(info["host"], int(info["port"]), timeout)

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Send one command; returns the reply, raises AdminError if it failed."""
        with socket.create_connection(self.address, timeout=self.timeout) as s:
            s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
            with s.makefile("rb") as f:
                line = f.readline()
        if not line:
            raise AdminError(f"admin port {self.address} closed without a reply to {cmd}")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise AdminError(f"admin command {cmd} failed: {reply.get('error')}")
        return reply

    def add_fault(self, action: str, **rule: Any) -> int:
        """Add a rule (fields as in :class:`FaultRule`, plus ``op``/``entry``/``entries``
        shorthands); returns its id."""
        return int(self.call("add_fault", rule={"action": action, **rule})["id"])

    def set_faults(self, rules: list[dict[str, Any]]) -> list[int]:
        return [int(i) for i in self.call("set_faults", rules=rules)["ids"]]

    def clear_faults(self) -> None:
        self.call("clear_faults")

    def faults(self) -> list[dict[str, Any]]:
        return list(self.call("status")["faults"])

    def set_readonly(self, readonly: bool) -> None:
        self.call("set_readonly", readonly=readonly)

    def status(self) -> dict[str, Any]:
        return self.call("status")

    def delete_entries(self, ledger: int, entries: list[int]) -> list[int]:
        return [
            int(e) for e in self.call("delete_entries", ledger=ledger, entries=entries)["deleted"]
        ]

    def corrupt_entry(self, ledger: int, entry: int, offset: int = -1) -> None:
        self.call("corrupt_entry", ledger=ledger, entry=entry, offset=offset)

    def zk_session(self) -> tuple[int, bytes]:
        r = self.call("zk_session")
        return int(r["session_id"]), bytes.fromhex(r["password"])
