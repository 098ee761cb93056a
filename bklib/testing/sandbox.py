"""A local BookKeeper cluster: a real ZooKeeper server plus N Python bookie processes.

Used by the test fixtures, the benchmarks, ``bkaudit sandbox up|down|status`` and the demo.
Everything listens on loopback; each process keeps its data and log under one directory.
A cluster started by the CLI outlives the command: its pids and ports are kept in
``<dir>/sandbox.json`` so ``down`` and ``status`` find it again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from kazoo.client import KazooClient

from bklib.bookie.faults import AdminClient
from bklib.meta.registration import list_bookies
from bklib.meta.store import LedgerStore, connect
from bklib.meta.underreplication import UnderReplicationManager
from bklib.states import DEFAULT_LEDGERS_ROOT
from bklib.testing.zkserver import ZooKeeperServer, four_letter_word, free_port, terminate

log = logging.getLogger(__name__)

STATE_FILE = "sandbox.json"


class BookieState(TypedDict):
    """One bookie of a detached sandbox, as recorded in its state file."""

    id: str
    pid: int | None
    dir: str


class SandboxState(TypedDict):
    """The state file of a detached sandbox (JSON in ``STATE_FILE`` under its base dir)."""

    zk: str
    ledgers_root: str
    zk_pid: int | None
    bookies: list[BookieState]


class SandboxError(RuntimeError):
    """A sandbox process did not start or stop as asked."""


class BookieProcess:
    """``python -m bklib.bookie`` as a child process, its log in ``<data_dir>.log``."""

    def __init__(
        self,
        zk: str,
        data_dir: Path,
        port: int | None = None,
        *,
        fault_injection: bool = False,
        extra: Iterable[str] = (),
        zk_timeout: float = 4.0,
        detach: bool = False,
    ) -> None:
        self.zk = zk
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.fault_injection = fault_injection
        self.extra = list(extra)
        self.zk_timeout = zk_timeout
        self.detach = detach
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.with_suffix(".log")

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "bklib.bookie",
            "--zk",
            self.zk,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--zk-timeout",
            str(self.zk_timeout),
            *self.extra,
        ]
        if self.fault_injection:
            cmd.append("--fault-injection")
        return cmd

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to serve."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=self.detach,
            )
        return self.proc

    def start(self, timeout: float = 30.0) -> BookieProcess:
        """Start and wait until the bookie port accepts connections."""
        proc = self.spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SandboxError(f"bookie exited with {proc.returncode}:\n{self.log_tail()}")
            try:
                socket.create_connection(self.address, timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.kill9()
        raise SandboxError(f"bookie did not come up on port {self.port}:\n{self.log_tail()}")

    def run_to_exit(self, timeout: float = 30.0) -> int:
        """Start and wait for the process to exit (for refusal tests)."""
        return self.spawn().wait(timeout)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit status."""
        if self.proc is None:
            return None
        return terminate(self.proc, timeout)

    def admin(self) -> AdminClient:
        """The fault-injection admin client (only with ``fault_injection=True``)."""
        return AdminClient.for_data_dir(self.data_dir)

    def __enter__(self) -> BookieProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Sandbox:
    """ZooKeeper plus ``num_bookies`` Python bookies under ``base_dir``.

    Tests share one ZooKeeper server: pass its connect string with a chroot as ``external_zk``
    and the sandbox lives in that chroot.
    """

    base_dir: Path
    num_bookies: int = 3
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    fault_injection: bool = False
    external_zk: str | None = None
    detach: bool = False
    bookies: list[BookieProcess] = field(default_factory=list)
    zk_server: ZooKeeperServer | None = None

    @property
    def zk_connect(self) -> str:
        if self.external_zk is not None:
            return self.external_zk
        if self.zk_server is None:
            raise SandboxError("sandbox not started")
        return self.zk_server.connect_string

    @property
    def bookie_ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies]

    def start(self, timeout: float = 60.0) -> Sandbox:
        """Start ZooKeeper (unless external), initialise the cluster znodes, start the bookies
        and wait until each has registered."""
        self.base_dir = Path(self.base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.external_zk is None:
            self.zk_server = ZooKeeperServer(self.base_dir / "zookeeper")
            if self.detach:
                self.zk_server.start_new_session = True
            self.zk_server.start()
        zk = connect(self.zk_connect)
        try:
            store = LedgerStore(zk, self.ledgers_root)
            store.init_cluster()
            UnderReplicationManager(zk, self.ledgers_root).ensure_layout()
            for i in range(self.num_bookies):
                self.add_bookie(index=i, wait=False)
            self.wait_registered(self.bookie_ids, zk, timeout)
        finally:
            zk.stop()
            zk.close()
        log.info("sandbox up: ZooKeeper %s, bookies %s", self.zk_connect, self.bookie_ids)
        return self

    def add_bookie(self, index: int | None = None, *, wait: bool = True) -> BookieProcess:
        index = len(self.bookies) if index is None else index
        extra = ["--ledgers-root", self.ledgers_root]
        b = BookieProcess(
            self.zk_connect,
            self.base_dir / f"bookie-{index}",
            fault_injection=self.fault_injection,
            extra=extra,
            detach=self.detach,
        )
        b.start()
        self.bookies.append(b)
        if wait:
            self.wait_registered([b.bookie_id])
        return b

    def wait_registered(
        self, ids: list[str], zk: KazooClient | None = None, timeout: float = 60.0
    ) -> None:
        """Block until every bookie in ``ids`` has a writable or read-only registration."""
        own = zk is None
        client = connect(self.zk_connect) if zk is None else zk
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                reg = list_bookies(client, self.ledgers_root)
                if all(reg.is_available(i) for i in ids):
                    return
                time.sleep(0.1)
            raise SandboxError(f"bookies {ids} did not register within {timeout}s")
        finally:
            if own:
                client.stop()
                client.close()

    def wait_unregistered(self, bookie_id: str, timeout: float = 60.0) -> float:
        """Block until ``bookie_id`` has no registration (a killed bookie's session expired);
        returns the seconds waited."""
        client = connect(self.zk_connect)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < timeout:
                if not list_bookies(client, self.ledgers_root).is_available(bookie_id):
                    return time.monotonic() - t0
                time.sleep(0.1)
            raise SandboxError(f"bookie {bookie_id} still registered after {timeout}s")
        finally:
            client.stop()
            client.close()

    def bookie(self, bookie_id: str) -> BookieProcess:
        for b in self.bookies:
            if b.bookie_id == bookie_id:
                return b
        raise KeyError(bookie_id)

    def kill_bookie(self, bookie_id: str) -> None:
        """SIGKILL one bookie; its registration goes when its ZooKeeper session expires."""
        self.bookie(bookie_id).kill9()

    def stop_bookie(self, bookie_id: str) -> None:
        """Stop one bookie cleanly (it unregisters at once)."""
        self.bookie(bookie_id).stop()

    def restart_bookie(self, bookie_id: str) -> None:
        b = self.bookie(bookie_id)
        b.stop()
        b.start()
        self.wait_registered([bookie_id])

    def stop(self) -> None:
        for b in self.bookies:
            b.stop()
        if self.zk_server is not None:
            self.zk_server.stop()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- detached clusters for the CLI ----------------------------------------------------------

    def save_state(self) -> Path:
        state: SandboxState = {
            "zk": self.zk_connect,
            "ledgers_root": self.ledgers_root,
            "zk_pid": self.zk_server.proc.pid if self.zk_server and self.zk_server.proc else None,
            "bookies": [
                {"id": b.bookie_id, "pid": b.proc.pid if b.proc else None, "dir": str(b.data_dir)}
                for b in self.bookies
            ],
        }
        path = Path(self.base_dir) / STATE_FILE
        path.write_text(json.dumps(state, indent=2))
        return path


def load_state(base_dir: Path) -> SandboxState:
    path = Path(base_dir) / STATE_FILE
    if not path.exists():
        raise SandboxError(f"no sandbox in {base_dir} (missing {path})")
    state: SandboxState = json.loads(path.read_text())
    return state


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_detached(base_dir: Path, timeout: float = 15.0) -> list[str]:
    """Stop a sandbox started with ``detach=True``: bookies first, then ZooKeeper."""
    state = load_state(base_dir)
    stopped = []
    pids = [(b["id"], b["pid"]) for b in state["bookies"]]
    pids.append(("zookeeper", state["zk_pid"]))
    for name, pid in pids:
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stopped.append(name)
    (Path(base_dir) / STATE_FILE).unlink(missing_ok=True)
    return stopped


def detached_status(base_dir: Path) -> dict[str, object]:
    """Which sandbox processes are alive and which bookies are registered."""
    state = load_state(base_dir)
    zk_ok = False
    host, _, port = str(state["zk"]).partition(":")
    with contextlib.suppress(OSError):
        zk_ok = b"Mode:" in four_letter_word(host, int(port.split("/")[0]), b"srvr")
    registered: dict[str, str] = {}
    if zk_ok:
        client = connect(str(state["zk"]))
        try:
            reg = list_bookies(client, str(state["ledgers_root"]))
            registered = {i: "writable" for i in reg.writable} | {
                i: "readonly" for i in reg.readonly
            }
        finally:
            client.stop()
            client.close()
    bookies = [
        {
            "id": b["id"],
            "alive": pid_alive(b["pid"]),
            "registered": registered.get(b["id"], "no"),
        }
        for b in state["bookies"]
    ]
    return {"zk": state["zk"], "zk_serving": zk_ok, "bookies": bookies}
