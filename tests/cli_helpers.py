"""Running the real ``bkaudit`` command in a subprocess, for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

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
