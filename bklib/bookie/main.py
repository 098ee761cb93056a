"""The Python bookie process: wiring of storage, server, registration and admin port.

Start order: bind the port (the default bookie id ``<host>:<port>`` needs it), connect to
ZooKeeper and check the cookie (refuse to start on a mismatch), replay the journal, start the
admin port (fault injection only), accept connections, then register in ZooKeeper (in the
background: a previous incarnation's ephemeral node may have to expire first).

CLI::

    python -m bklib.bookie --zk HOST:PORT[/chroot] --port P --data-dir D
        [--bookie-id ID] [--host 127.0.0.1] [--advertised-host H] [--readonly]
        [--ledgers-root /ledgers]
        [--fault-injection] [--admin-port 0] [--zk-timeout 10]
        [--min-free-bytes N] [--disk-usage-threshold 0.95] [--journal-file-size N]
        [--tls-provider-factory-class TLSContextFactory --tls-certificate-path PEM
         --tls-key-store PEM [--tls-trust-store PEM --tls-client-authentication]]
        [--zk-tls --zk-tls-ca PEM [--zk-tls-cert PEM --zk-tls-key PEM]]
        [--zk-sasl-jaas-file JAAS] [--zk-enable-security auto|true|false]

Exit status 2 means the bookie refused to start (cookie mismatch, data dir in use, bad
argument); the reason is the last line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bklib.bookie import journal as jr
from bklib.bookie.faults import AdminServer, FaultInjector, FaultRule
from bklib.bookie.registration import Registration, check_bookie_id
from bklib.bookie.server import BookieServer
from bklib.bookie.storage import Storage
from bklib.cancellation import cancel_and_wait
from bklib.errors import BKError
from bklib.meta.oxia_security import add_oxia_access_arguments, oxia_access_from_args
from bklib.meta.stores.zookeeper.security import (
    ZkAuth,
    add_zk_access_arguments,
    zk_access_from_args,
)
from bklib.proto.framing import MAX_FRAME_SIZE
from bklib.states import DEFAULT_LEDGERS_ROOT
from bklib.tls import TlsSettings, add_tls_arguments, tls_settings_from_args

log = logging.getLogger(__name__)

EXIT_REFUSED = 2


@dataclass
class BookieConfig:
    """Everything a bookie needs; ``zk=None`` runs without ZooKeeper (no cookie, no
    registration), for in-process tests."""

    data_dir: Path
    port: int = 3181
    zk: str | None = None
    host: str = "127.0.0.1"
    # Address published in the registration and used in the default bookie id; defaults to
    # ``host``, or 127.0.0.1 when listening on all interfaces.
    advertised_host: str | None = None
    bookie_id: str | None = None
    readonly: bool = False
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    fault_injection: bool = False
    admin_port: int = 0
    zk_timeout: float = 10.0
    # TLS / SASL / ACLs of the ZooKeeper session (bklib.meta.stores.zookeeper.security);
    # None: plaintext.
    zk_auth: ZkAuth = None
    max_frame: int = MAX_FRAME_SIZE
    journal_file_size: int = jr.DEFAULT_FILE_SIZE
    # Read-only when free space falls below this many bytes or the used fraction exceeds the
    # threshold (BookKeeper's diskUsageThreshold default 0.95).
    min_free_bytes: int = 64 * 1024 * 1024
    disk_usage_threshold: float = 0.95
    disk_check_interval: float = 1.0
    # Bookie TLS (BookKeeper's tlsProviderFactoryClass set): START_TLS served, plaintext refused.
    tls: TlsSettings | None = None


class Bookie:
    """One running Python bookie. ``await start()``, then ``await stop()``."""

    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        self.bookie_id = ""
        self.advertised_host = config.host
        self.port = 0
        self.storage: Storage | None = None
        self.server: BookieServer | None = None
        self.registration: Registration | None = None
        self.faults = FaultInjector() if config.fault_injection else None
        self.admin: AdminServer | None = None
        self._sock: socket.socket | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reg_lock: asyncio.Lock | None = None
        self._reg_wanted = asyncio.Event()
        self.registered = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Bring the bookie up; raises CookieError / DataDirLockedError to refuse."""
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self._reg_lock = asyncio.Lock()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((cfg.host, cfg.port))
        self.port = self._sock.getsockname()[1]
        self.advertised_host = cfg.advertised_host or (
            "127.0.0.1" if cfg.host in ("", "0.0.0.0") else cfg.host
        )
        self.bookie_id = check_bookie_id(cfg.bookie_id or f"{self.advertised_host}:{self.port}")
        self.storage = Storage(
            self.data_dir, journal_file_size=cfg.journal_file_size, name=self.bookie_id
        )
        try:
            self.storage.lock()
            if cfg.zk is not None:
                self.registration = Registration(
                    cfg.zk,
                    bookie_id=self.bookie_id,
                    host=self.advertised_host,
                    port=self.port,
                    root=cfg.ledgers_root,
                    session_timeout=cfg.zk_timeout,
                    on_session_restored=self._session_restored,
                    zk_auth=cfg.zk_auth,
                )
                reg = self.registration
                await self._run_blocking(reg.start)
                await self._run_blocking(reg.check_cookie, self.data_dir)
            self.storage.open()
            self.server = BookieServer(
                self.storage,
                name=self.bookie_id,
                max_frame=cfg.max_frame,
                faults=self.faults,
                tls=cfg.tls,
            )
            self.server.forced_readonly = cfg.readonly
            self._check_disk()
            if self.faults is not None:
                self.admin = AdminServer(self._admin_handlers(), self.bookie_id)
                await self.admin.start(cfg.admin_port, self.data_dir)
            await self.server.start(self._sock)
        except BaseException:
            await self._teardown()
            raise
        self._spawn(self._disk_monitor())
        if self.registration is not None:
            self._spawn(self._registration_loop())
            self._reg_wanted.set()
        log.info(
            "bookie %s up: port %d, data %s%s",
            self.bookie_id,
            self.port,
            self.data_dir,
            " (read-only)" if self.server.readonly else "",
        )

    async def stop(self) -> None:
        """Unregister, stop serving, sync the journal and release the data dir."""
        await cancel_and_wait(list(self._tasks))
        await self._teardown()
        log.info("bookie %s stopped", self.bookie_id)

    async def _teardown(self) -> None:
        if self.registration is not None:
            with contextlib.suppress(Exception):
                await self._run_blocking(self.registration.stop)
            self.registration = None
        if self.server is not None:
            await self.server.stop()
        if self.admin is not None:
            await self.admin.stop()
        if self.storage is not None:
            with contextlib.suppress(Exception):
                await self.storage.close()
        if self._sock is not None:
            self._sock.close()

    async def _run_blocking(self, fn: Any, *args: Any) -> Any:
        assert self._loop is not None
        return await self._loop.run_in_executor(None, fn, *args)

    def _spawn(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- read-only state and registration --------------------------------------------------

    @property
    def readonly(self) -> bool:
        return self.server is not None and self.server.readonly

    async def set_readonly(self, readonly: bool) -> None:
        """Force (or lift) read-only mode; returns once the registration reflects it."""
        assert self.server is not None
        self.server.forced_readonly = readonly
        log.warning("bookie %s: forced read-only %s", self.bookie_id, readonly)
        await self._sync_registration()

    async def _sync_registration(self) -> None:
        if self.registration is None or self.server is None:
            return
        assert self._reg_lock is not None
        async with self._reg_lock:
            await self._run_blocking(self.registration.register, self.server.readonly)
            self.registered.set()

    async def _registration_loop(self) -> None:
        """Registers whenever asked (start, session restored, read-only change) until it
        succeeds; ZooKeeper trouble is logged and retried, never fatal."""
        while True:
            await self._reg_wanted.wait()
            self._reg_wanted.clear()
            try:
                await self._sync_registration()
            except Exception as exc:  # noqa: BLE001 - unregistered until a retry succeeds: fails closed
                log.warning("bookie %s: registration failed, retrying: %s", self.bookie_id, exc)
                self._reg_wanted.set()
                await asyncio.sleep(0.5)

    def _session_restored(self) -> None:
        # Called on kazoo's thread.
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._after_session_restored)

    def _after_session_restored(self) -> None:
        self.registered.clear()
        self._reg_wanted.set()

    def _check_disk(self) -> bool:
        """Update the disk-full read-only state; True if it changed."""
        cfg = self.config
        assert self.server is not None
        try:
            st = os.statvfs(self.data_dir)
        except OSError as exc:
            log.error("bookie %s: statvfs(%s) failed: %s", self.bookie_id, self.data_dir, exc)
            return False
        free = st.f_bavail * st.f_frsize
        total = st.f_blocks * st.f_frsize or 1
        full = free < cfg.min_free_bytes or (1 - free / total) > cfg.disk_usage_threshold
        if full == self.server.disk_readonly:
            return False
        self.server.disk_readonly = full
        log.warning(
            "bookie %s: disk %s (%d of %d bytes free): %s",
            self.bookie_id,
            self.data_dir,
            free,
            total,
            "going read-only" if full else "writable again",
        )
        return True

    async def _disk_monitor(self) -> None:
        """Re-checks free space and moves the registration when read-only changes (also
        after a journal failure, which leaves the bookie read-only for good)."""
        assert self.server is not None
        while True:
            await asyncio.sleep(self.config.disk_check_interval)
            self._check_disk()
            if self.registration is not None and self.registration.readonly not in (
                None,
                self.server.readonly,
            ):
                self._reg_wanted.set()

    # -- admin -----------------------------------------------------------------------------

    def _admin_handlers(self) -> dict[str, Any]:
        async def ping(_: dict[str, Any]) -> dict[str, Any]:
            return {}

        async def status(_: dict[str, Any]) -> dict[str, Any]:
            assert self.storage is not None
            return {
                "bookie_id": self.bookie_id,
                "port": self.port,
                "readonly": self.readonly,
                "ledgers": len(self.storage.ledgers),
                "faults": [r.to_json() for r in (self.faults.rules if self.faults else [])],
            }

        async def add_fault(cmd: dict[str, Any]) -> dict[str, Any]:
            assert self.faults is not None
            return {"id": self.faults.add(FaultRule.from_json(cmd["rule"]))}

        async def set_faults(cmd: dict[str, Any]) -> dict[str, Any]:
            assert self.faults is not None
            rules = [FaultRule.from_json(r) for r in cmd.get("rules", [])]
            self.faults.clear()
            return {"ids": [self.faults.add(r) for r in rules]}

        async def clear_faults(_: dict[str, Any]) -> dict[str, Any]:
            assert self.faults is not None
            self.faults.clear()
            return {}

        async def set_readonly(cmd: dict[str, Any]) -> dict[str, Any]:
            await self.set_readonly(bool(cmd["readonly"]))
            return {"readonly": self.readonly}

        async def delete_entries(cmd: dict[str, Any]) -> dict[str, Any]:
            assert self.storage is not None
            deleted, seq = self.storage.delete_entries(
                int(cmd["ledger"]), [int(e) for e in cmd["entries"]]
            )
            await self.storage.journal.wait_durable(seq)
            return {"deleted": deleted}

        async def corrupt_entry(cmd: dict[str, Any]) -> dict[str, Any]:
            assert self.storage is not None
            await self.storage.corrupt_entry(
                int(cmd["ledger"]), int(cmd["entry"]), int(cmd.get("offset", -1))
            )
            return {}

        async def zk_session(_: dict[str, Any]) -> dict[str, Any]:
            if self.registration is None:
                raise BKError("this bookie runs without ZooKeeper", bookie=self.bookie_id)
            sid, pwd = self.registration.session()
            return {"session_id": sid, "password": pwd.hex()}

        return {
            "ping": ping,
            "status": status,
            "add_fault": add_fault,
            "set_faults": set_faults,
            "clear_faults": clear_faults,
            "set_readonly": set_readonly,
            "delete_entries": delete_entries,
            "corrupt_entry": corrupt_entry,
            "zk_session": zk_session,
        }


async def run_bookie(config: BookieConfig, stop: asyncio.Event | None = None) -> None:
    """Run a bookie until ``stop`` is set or SIGTERM/SIGINT arrives."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    bookie = Bookie(config)
    await bookie.start()
    try:
        await stop.wait()
    finally:
        await bookie.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bklib.bookie", description="A BookKeeper 4.17-compatible Python bookie."
    )
    p.add_argument(
        "--zk",
        required=True,
        help="metadata store: ZooKeeper HOST:PORT[/chroot] or oxia://HOST:PORT/NAMESPACE",
    )
    p.add_argument("--port", type=int, required=True, help="bookie port (0: any free port)")
    p.add_argument("--data-dir", type=Path, required=True, help="journal, index and cookie")
    p.add_argument("--bookie-id", help="bookie id (default HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1", help="listen address")
    p.add_argument("--advertised-host", help="published address (default: --host)")
    p.add_argument("--readonly", action="store_true", help="start in forced read-only mode")
    p.add_argument("--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper root znode")
    p.add_argument(
        "--fault-injection",
        action="store_true",
        help="enable fault injection and the loopback admin port (tests only)",
    )
    p.add_argument("--admin-port", type=int, default=0, help="admin port (0: any free port)")
    p.add_argument("--zk-timeout", type=float, default=10.0, help="ZooKeeper session timeout, s")
    p.add_argument("--min-free-bytes", type=int, default=BookieConfig.min_free_bytes)
    p.add_argument("--disk-usage-threshold", type=float, default=0.95)
    p.add_argument("--disk-check-interval", type=float, default=1.0)
    p.add_argument("--journal-file-size", type=int, default=jr.DEFAULT_FILE_SIZE)
    p.add_argument("--max-frame-size", type=int, default=MAX_FRAME_SIZE)
    p.add_argument("--log-level", default="INFO")
    add_tls_arguments(p, role="server")
    add_zk_access_arguments(p)  # --zk-tls*, --zk-sasl-jaas-file, --zk-enable-security
    add_oxia_access_arguments(p)  # --oxia-tls*, --oxia-token-file (a store at oxia://...)
    return p


def store_auth_from_args(args: argparse.Namespace) -> ZkAuth:
    """The store's access: Oxia's TLS and token when given (``--zk oxia://...``), else
    ZooKeeper's. Raises ValueError (the refusal to start) for Oxia flags on ZooKeeper."""
    oxia = oxia_access_from_args(args)
    if oxia is None:
        return zk_access_from_args(args)
    if not args.zk.startswith("oxia://"):
        raise ValueError(f"--oxia-tls and --oxia-token-file secure Oxia only, not {args.zk}")
    return oxia


def config_from_args(args: argparse.Namespace) -> BookieConfig:
    return BookieConfig(
        data_dir=args.data_dir,
        port=args.port,
        zk=args.zk,
        host=args.host,
        advertised_host=args.advertised_host,
        bookie_id=args.bookie_id,
        readonly=args.readonly,
        ledgers_root=args.ledgers_root,
        fault_injection=args.fault_injection,
        admin_port=args.admin_port,
        zk_timeout=args.zk_timeout,
        zk_auth=store_auth_from_args(args),
        max_frame=args.max_frame_size,
        journal_file_size=args.journal_file_size,
        min_free_bytes=args.min_free_bytes,
        disk_usage_threshold=args.disk_usage_threshold,
        disk_check_interval=args.disk_check_interval,
        tls=tls_settings_from_args(args, role="server"),
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = config_from_args(args)
        asyncio.run(run_bookie(config))
    except (BKError, ValueError, OSError) as exc:
        # CookieError, DataDirLockedError, CorruptJournalError, a corrupt cookie, a port in
        # use...: the bookie must not run; say why on the last line.
        log.error("bookie refused to start: %s", exc)
        print(f"bookie refused to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:
        log.exception("bookie failed")
        print(f"bookie failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
