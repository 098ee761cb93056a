"""``bkaudit sandbox up|down|status``: a local cluster on loopback (a real ZooKeeper, or Oxia
with ``--metadata oxia``, and N Python bookies) that outlives the command; its state lives in
``--dir``."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import cast

from jobs.runtime.exit_status import ExitStatus

__all__ = ["DEFAULT_SANDBOX_DIR", "add_sandbox_arguments", "prepare_zookeeper", "run_sandbox"]

DEFAULT_SANDBOX_DIR = Path("sandbox-data")


def add_sandbox_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The sandbox's action and flags."""
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--dir", default=str(DEFAULT_SANDBOX_DIR), help="data and state directory")
    parser.add_argument("--bookies", type=int, default=5, help="number of bookies (up)")
    parser.add_argument(
        "--metadata",
        choices=["zookeeper", "oxia"],
        default="zookeeper",
        help="the metadata store (up): ZooKeeper, or Oxia with Pulsar's driver "
        "(docs/metadata-stores.md)",
    )
    parser.add_argument(
        "--faults", action="store_true", help="enable the bookies' fault-injection admin port"
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="bookies serve TLS only (START_TLS), with a test CA and certificates under DIR/tls",
    )
    return parser


def prepare_zookeeper() -> str | None:
    """Make a ZooKeeper server runnable here: Java on PATH, and the pinned server jars fetched
    from Maven Central (cached) with a progress bar. Returns None when ready, else the one line
    that says what is missing."""
    from bklib.maven import FetchError
    from bklib.testing.zkserver import JAVA_MISSING
    from bklib.testing.zookeeper_dist import (
        ZOOKEEPER_SERVER,
        ZOOKEEPER_VERSION,
        fetch_zookeeper,
        is_complete,
        zookeeper_lib,
    )
    from jobs.runtime.progress import Progress

    if shutil.which("java") is None:
        return JAVA_MISSING
    lib = zookeeper_lib()
    if is_complete(lib):
        return None
    print(f"fetching ZooKeeper {ZOOKEEPER_VERSION} from Maven Central into {lib}", file=sys.stderr)
    what = f"ZooKeeper {ZOOKEEPER_VERSION} jars"
    try:
        with Progress(what, len(ZOOKEEPER_SERVER), unit="jars") as bar:
            fetch_zookeeper(lib, fetched=lambda _: bar.advance())
    except FetchError as exc:
        return str(exc)
    return None


def run_sandbox(args: argparse.Namespace) -> int:
    """Start, stop or show the sandbox recorded in ``args.dir``."""
    from bklib.testing.oxiaserver import OxiaUnavailable
    from bklib.testing.sandbox import OXIA, SandboxError
    from bklib.testing.zkserver import ZooKeeperUnavailable

    try:
        if args.action == "up":
            missing = prepare_zookeeper() if args.metadata != OXIA else None
            if missing is not None:
                print(f"sandbox: {missing}", file=sys.stderr)
                return ExitStatus.OPERATOR_ERROR
            return _up(args)
        if args.action == "down":
            from bklib.testing.sandbox import stop_detached

            stopped = stop_detached(Path(args.dir))
            print("stopped: " + (", ".join(stopped) or "nothing was running"))
        else:
            _status(Path(args.dir))
    except (SandboxError, ZooKeeperUnavailable, OxiaUnavailable) as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    return ExitStatus.OK


def _up(args: argparse.Namespace) -> int:
    from bklib.testing.sandbox import Sandbox, client_tls_flags

    base = Path(args.dir)
    if (base / "sandbox.json").exists():
        print(f"a sandbox is already recorded in {base}; run `bkaudit sandbox down` first")
        return ExitStatus.OPERATOR_ERROR
    sb = Sandbox(
        base,
        num_bookies=args.bookies,
        detach=True,
        fault_injection=args.faults,
        tls=args.tls,
        metadata=args.metadata,
    )
    try:
        sb.start()
    except BaseException:
        sb.stop()  # no half-started processes left behind, whatever stopped the start
        raise
    sb.save_state()
    print(f"{_store_label(sb.zk_connect)} {sb.zk_connect}")
    for b in sb.bookies:
        print(f"bookie     {b.bookie_id}  data {b.data_dir}  log {b.log_path}")
    print(
        f"use: --zk {sb.zk_connect}"
        if sb.oxia_server is None
        else f"use: --metadata-uri {sb.metadata_uri}"
    )
    if sb.client_tls is not None:
        print("bookie TLS: add " + " ".join(client_tls_flags(sb.client_tls)))
    return ExitStatus.OK


def _status(base: Path) -> None:
    from bklib.testing.sandbox import detached_status

    st = detached_status(base)
    print(f"{_store_label(str(st['zk']))} {st['zk']}  {'serving' if st['zk_serving'] else 'DOWN'}")
    bookies = cast("list[dict[str, object]]", st["bookies"])
    for b in bookies:
        alive = "running" if b["alive"] else "STOPPED"
        print(f"bookie     {b['id']:<22} {alive:<8} registered: {b['registered']}")


def _store_label(locator: str) -> str:
    """``ZooKeeper`` or ``Oxia``, padded to the bookie lines' column."""
    from bklib.meta.stores import is_oxia

    return f"{'Oxia' if is_oxia(locator) else 'ZooKeeper':<10}"
