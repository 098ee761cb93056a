"""The bookie farm: one process serving N bookie identities on N ports, for the scale harness.

Each identity is the Python bookie's protocol server (:class:`bklib.bookie.server.BookieServer`,
v2 and v3: reads, batch reads, read LAC, list-entries, fence, adds and recovery adds) over a
:class:`~bklib.testing.scale.storage.PlannedStorage`, and registers as a real bookie does
(cookie, ephemeral ``available`` znode, one metadata session each). What a farm reproduces of a
real bookie and what it does not is in docs/scale.md.

    python -m bklib.testing.scale.farm --zk HOST:PORT/chroot --dir DIR --bookies 100 \
        --ledgers 1000000 [--seed 1]

Once every identity is up it writes ``DIR/farm.json`` (``bookies``, ``admin_port``, ``ledgers``,
``seed``); :class:`FarmClient` reads it. The admin port takes one JSON command per line
(bklib.bookie.faults' protocol): ``status``, ``stop``, ``start``, ``stall``, ``fail``,
``clear``, ``damage`` and ``zk_session``, each naming its ``bookie``. An identity whose
session expires registers again in a new one, as a real bookie does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bklib.bookie.faults import AdminClient, AdminServer, FaultInjector, FaultRule
from bklib.bookie.journal import Journal
from bklib.bookie.registration import Registration
from bklib.bookie.server import BookieServer
from bklib.errors import BKError
from bklib.proto import protocol_pb2 as pb
from bklib.states import DEFAULT_LEDGERS_ROOT
from bklib.testing.scale.plan import ScalePlan
from bklib.testing.scale.storage import PlannedStorage, shared_plans

log = logging.getLogger(__name__)

FARM_FILE = "farm.json"


class UnknownIdentity(KeyError):
    """An admin command named a bookie the farm does not serve."""


@dataclass
class Identity:
    """One bookie of the farm."""

    bookie_id: str
    sock: socket.socket
    storage: PlannedStorage
    faults: FaultInjector
    server: BookieServer | None = None
    registration: Registration | None = None
    stopped: bool = False


class BookieFarm:
    """N identities in this process, on one event loop."""

    def __init__(
        self,
        zk: str,
        base: Path,
        *,
        bookies: int,
        ledgers: int,
        seed: int = 1,
        host: str = "127.0.0.1",
        root: str = DEFAULT_LEDGERS_ROOT,
        zk_timeout: float = 10.0,
    ) -> None:
        self.zk = zk
        self.base = Path(base)
        self.host = host
        self.root = root
        self.zk_timeout = zk_timeout
        self.count = bookies
        self.ledgers = ledgers
        self.seed = seed
        self.identities: dict[str, Identity] = {}
        self.journal = Journal(self.base / "journal", name="farm")
        self.admin: AdminServer | None = None
        self.plan: ScalePlan | None = None

    async def start(self) -> None:
        """Bind every port, build the plan over the identities, serve, register, then write
        ``farm.json``."""
        self.base.mkdir(parents=True, exist_ok=True)
        socks = []
        for _ in range(self.count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, 0))
            socks.append(sock)
        ids = tuple(f"{self.host}:{s.getsockname()[1]}" for s in socks)
        self.plan = ScalePlan(self.ledgers, ids, self.seed)
        self.journal.open()
        plans = shared_plans(self.plan)
        for bookie_id, sock in zip(ids, socks, strict=True):
            data_dir = self.base / bookie_id.replace(":", "_")
            data_dir.mkdir(exist_ok=True)
            storage = PlannedStorage(self.plan, bookie_id, self.journal, data_dir, plans=plans)
            ident = Identity(bookie_id, sock, storage, FaultInjector())
            ident.server = BookieServer(storage, name=bookie_id, faults=ident.faults)
            await ident.server.start(sock)
            self.identities[bookie_id] = ident
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(None, self._register, i) for i in self.identities.values())
        )
        self.admin = AdminServer(self._handlers(), "farm")
        await self.admin.start()
        info = {
            "bookies": list(ids),
            "admin_port": self.admin.port,
            "ledgers": self.ledgers,
            "seed": self.seed,
        }
        tmp = self.base / (FARM_FILE + ".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(self.base / FARM_FILE)
        log.info("bookie farm: %d identities up, %d planned ledgers", len(ids), self.ledgers)

    def _register(self, ident: Identity) -> None:
        host, port = ident.bookie_id.rsplit(":", 1)
        reg = Registration(
            self.zk,
            bookie_id=ident.bookie_id,
            host=host,
            port=int(port),
            root=self.root,
            session_timeout=self.zk_timeout,
        )
        reg.on_session_restored = lambda: self._register_again(ident, reg)
        reg.start()
        reg.check_cookie(ident.storage.data_dir)
        reg.register(False)
        ident.registration = reg

    def _register_again(self, ident: Identity, reg: Registration) -> None:
        """A new session after an expired one: registered again, as BookKeeper's
        ``BookieStateManager`` does (a ZooKeeper restart must not look like lost bookies).
        Called on the store's thread, which must not block: the work is a thread's."""

        def again() -> None:
            while not ident.stopped and ident.registration is reg:
                try:
                    reg.register(False)
                    return
                except BKError as exc:  # the store's: retried until it holds, as a bookie does
                    log.warning(
                        "bookie farm: identity %s not registered again (%s); retrying",
                        ident.bookie_id,
                        exc,
                    )
                    time.sleep(1.0)

        threading.Thread(target=again, name=f"register-{ident.bookie_id}", daemon=True).start()

    async def stop_identity(self, bookie_id: str) -> None:
        """As a bookie process that died: its session closes (the registration goes) and its
        port stops answering."""
        ident = self._identity(bookie_id)
        if ident.stopped:
            return
        ident.stopped = True
        if ident.registration is not None:
            await asyncio.get_running_loop().run_in_executor(None, ident.registration.stop)
        if ident.server is not None:
            await ident.server.stop()
        ident.sock.close()
        log.warning("bookie farm: identity %s stopped", bookie_id)

    async def start_identity(self, bookie_id: str) -> None:
        """As a stopped bookie process started again (a bookie that flaps): the same port and
        entries, a new session, the registration back. An identity not stopped is left as
        it is."""
        ident = self._identity(bookie_id)
        if not ident.stopped:
            return
        host, port = bookie_id.rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        ident.sock = sock
        ident.server = BookieServer(ident.storage, name=bookie_id, faults=ident.faults)
        await ident.server.start(sock)
        await asyncio.get_running_loop().run_in_executor(None, self._register, ident)
        ident.stopped = False
        log.warning("bookie farm: identity %s started again", bookie_id)

    async def stop(self) -> None:
        """Stop every identity and the admin port, then close the journal."""
        for bookie_id in list(self.identities):
            await self.stop_identity(bookie_id)
        if self.admin is not None:
            await self.admin.stop()
        await self.journal.close()

    def _identity(self, bookie_id: str) -> Identity:
        try:
            return self.identities[bookie_id]
        except KeyError:
            raise UnknownIdentity(f"the farm serves no bookie {bookie_id}") from None

    # ---- admin -------------------------------------------------------------------------------

    def _handlers(self) -> dict[str, Any]:
        async def status(cmd: dict[str, Any]) -> dict[str, Any]:
            return {
                "bookies": {
                    b: {"stopped": i.stopped, "faults": [r.to_json() for r in i.faults.rules]}
                    for b, i in self.identities.items()
                },
                "entries_read": sum(i.storage.entries_read for i in self.identities.values()),
            }

        async def stop(cmd: dict[str, Any]) -> dict[str, Any]:
            await self.stop_identity(str(cmd["bookie"]))
            return {}

        async def start(cmd: dict[str, Any]) -> dict[str, Any]:
            await self.start_identity(str(cmd["bookie"]))
            return {}

        async def stall(cmd: dict[str, Any]) -> dict[str, Any]:
            rule = FaultRule(action="drop")
            return {"id": self._identity(str(cmd["bookie"])).faults.add(rule)}

        async def fail(cmd: dict[str, Any]) -> dict[str, Any]:
            status = pb.StatusCode.Value(str(cmd.get("status", "EIO")))
            rule = FaultRule(action="fail", status=status)
            return {"id": self._identity(str(cmd["bookie"])).faults.add(rule)}

        async def clear(cmd: dict[str, Any]) -> dict[str, Any]:
            self._identity(str(cmd["bookie"])).faults.clear()
            return {}

        async def damage(cmd: dict[str, Any]) -> dict[str, Any]:
            storage = self._identity(str(cmd["bookie"])).storage
            entries = [int(e) for e in cmd["entries"]]
            deleted, _ = storage.delete_entries(int(cmd["ledger"]), entries)
            return {"deleted": deleted}

        async def zk_session(cmd: dict[str, Any]) -> dict[str, Any]:
            reg = self._identity(str(cmd["bookie"])).registration
            if reg is None:
                raise UnknownIdentity(f"identity {cmd['bookie']} is not registered")
            sid, pwd = reg.session()
            return {"session_id": sid, "password": pwd.hex()}

        return {
            "ping": status,
            "status": status,
            "zk_session": zk_session,
            "stop": stop,
            "start": start,
            "stall": stall,
            "fail": fail,
            "clear": clear,
            "damage": damage,
        }


class FarmClient:
    """Blocking client of a running farm (from its ``farm.json``)."""

    def __init__(self, base: Path, timeout: float = 60.0) -> None:
        info = json.loads((Path(base) / FARM_FILE).read_text())
        self.bookies: tuple[str, ...] = tuple(info["bookies"])
        self.plan = ScalePlan(int(info["ledgers"]), self.bookies, int(info["seed"]))
        self.admin = AdminClient("127.0.0.1", int(info["admin_port"]), timeout)

    def stop(self, bookie: str) -> None:
        """Stop one identity: registration gone, port closed."""
        self.admin.call("stop", bookie=bookie)

    def start(self, bookie: str) -> None:
        """Start a stopped identity again: same port and entries, registered anew."""
        self.admin.call("start", bookie=bookie)

    def stall(self, bookie: str) -> None:
        """Make one identity accept requests and never answer them."""
        self.admin.call("stall", bookie=bookie)

    def fail(self, bookie: str, status: str = "EIO") -> None:
        """Make one identity answer every request with ``status``."""
        self.admin.call("fail", bookie=bookie, status=status)

    def clear(self, bookie: str) -> None:
        """Lift a stall or failure."""
        self.admin.call("clear", bookie=bookie)

    def damage(self, bookie: str, ledger: int, entries: Sequence[int]) -> list[int]:
        """Forget entries of one identity; returns those it had."""
        reply = self.admin.call("damage", bookie=bookie, ledger=ledger, entries=list(entries))
        return [int(e) for e in reply["deleted"]]

    def status(self) -> dict[str, Any]:
        return dict(self.admin.call("status")["bookies"])

    def zk_session(self, bookie: str) -> tuple[int, bytes]:
        """(session id, password) of one identity's registration session (tests expire it)."""
        r = self.admin.call("zk_session", bookie=bookie)
        return int(r["session_id"]), bytes.fromhex(r["password"])

    def entries_read(self) -> int:
        """Entries every identity has served so far (single and batch reads)."""
        return int(self.admin.call("status")["entries_read"])


async def _serve(args: argparse.Namespace) -> None:
    farm = BookieFarm(
        args.zk, Path(args.dir), bookies=args.bookies, ledgers=args.ledgers, seed=args.seed,
        root=args.ledgers_root,
    )  # fmt: skip
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await farm.start()
    await stopping.wait()
    await farm.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """The farm process (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bklib.testing.scale.farm", description=__doc__)
    p.add_argument("--zk", required=True, help="ZooKeeper connect string (with chroot)")
    p.add_argument("--dir", required=True, help="directory for farm.json and the journal")
    p.add_argument("--bookies", type=int, required=True)
    p.add_argument("--ledgers", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ledgers-root", default=DEFAULT_LEDGERS_ROOT)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
