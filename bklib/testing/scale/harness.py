"""Start and stop a bookie farm process for tests and bench/scale.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bklib.errors import BKError
from bklib.states import DEFAULT_LEDGERS_ROOT
from bklib.testing.scale.farm import FARM_FILE, FarmClient


class FarmStartError(BKError):
    """The farm process exited or did not come up in time."""


@contextlib.contextmanager
def running_farm(
    zk: str,
    base: Path,
    *,
    bookies: int,
    ledgers: int,
    seed: int = 1,
    root: str = DEFAULT_LEDGERS_ROOT,
    start_timeout: float = 120.0,
) -> Iterator[tuple[FarmClient, subprocess.Popen[bytes]]]:
    """A farm process serving ``bookies`` identities over a plan of ``ledgers`` ledgers; yields
    its client and process once every identity is registered; stopped (SIGTERM) on exit.
    Its log is ``base/farm.log``."""
    base.mkdir(parents=True, exist_ok=True)
    (base / FARM_FILE).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "bklib.testing.scale.farm", "--zk", zk, "--dir", str(base)]
    argv += ["--bookies", str(bookies), "--ledgers", str(ledgers), "--seed", str(seed)]
    argv += ["--ledgers-root", root]
    with (base / "farm.log").open("ab") as logf:
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + start_timeout
        while not (base / FARM_FILE).is_file():
            if proc.poll() is not None:
                raise FarmStartError(
                    f"the bookie farm exited with {proc.returncode}: {_tail(base)}"
                )
            if time.monotonic() > deadline:
                raise FarmStartError(f"the bookie farm did not start in {start_timeout:.0f}s")
            time.sleep(0.1)
        yield FarmClient(base), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _tail(base: Path) -> str:
    try:
        return "\n".join((base / "farm.log").read_text(errors="replace").splitlines()[-20:])
    except OSError:
        return "(no log)"
