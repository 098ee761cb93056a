"""Running the real ``bkaudit`` command in a subprocess, for the CLI tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
BYTECODE_DIRS = ("bklib", "jobs", "airflow_dags", "tests", "bench")


def bkaudit(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m jobs.cli ARGS`` from the checkout; output captured as text. ``env`` adds
    to (or overrides) this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


def byte_compile() -> None:
    """Byte-compile the checkout's packages, as ``pip install`` does for an installed package.
    Benchmarks that time ``bkaudit`` commands call it first: under PYTHONDONTWRITEBYTECODE
    (set on some CI machines) every process would otherwise compile its modules again, a cost
    an operator's install never pays (``make bytecode`` runs this)."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", *BYTECODE_DIRS], cwd=REPO, check=True
    )


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr lines that are not log records (records start with a timestamp)."""
    return [x for x in proc.stderr.splitlines() if x and not x[:4].isdigit()]


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """An operator error: exit 2, no traceback, and exactly one stderr line besides log
    records; returns that line."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1, proc.stderr
    return lines[0]


def failure(proc: subprocess.CompletedProcess[str], *context: object) -> str:
    """A failed command's account, for an assertion message: its arguments, its exit code,
    ``context`` and the tails of its output. A string, because pytest cuts the repr of any
    other message to a few hundred characters (a tuple of the outputs once lost why a Spark
    driver's JVM had exited)."""
    args = proc.args if isinstance(proc.args, str) else " ".join(map(str, proc.args))
    return "\n".join(
        [
            f"$ {args}",
            f"exit {proc.returncode}",
            *map(str, context),
            "--- stdout, the end ---",
            (proc.stdout or "")[-3000:],
            "--- stderr, the end ---",
            (proc.stderr or "")[-6000:],
        ]
    )


def frozen_past_its_session(
    argv: list[str], zk_port: int, *, after: float, pause: float = 5.0
) -> subprocess.CompletedProcess[str]:
    """Run ``bkaudit ARGV``, freeze it (SIGSTOP: a GC pause, a frozen VM) for ``pause`` seconds
    once it has held a connection to ``zk_port`` for ``after`` seconds, and let it finish. With
    ``--zk-session-timeout`` under half of ``pause``, ZooKeeper expires its session meanwhile."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", *argv],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        me = psutil.Process(proc.pid)
        deadline = time.monotonic() + 60
        # A session's connection, not the reachability probe's brief one
        # (bklib/meta/stores/reachability.py): the same client port still open 0.5 s later.
        held: set[int] = set()
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            now = {
                c.laddr.port
                for c in me.net_connections("tcp")
                if c.raddr and c.raddr.port == zk_port
            }
            if now & held:
                break
            held = now
            time.sleep(0.5)
        time.sleep(after)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(pause)
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
