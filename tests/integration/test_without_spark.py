"""``pip install bkaudit`` without the ``spark`` extra: every ``--help`` works, a Spark run
says in one line which extra to install (exit 2), and the local executor audits as usual.

pyspark is installed in the test venv, so each command runs in a subprocess whose
``sitecustomize`` makes ``pyspark``, ``delta`` and ``py4j`` unimportable, exactly as when they
were never installed (``ModuleNotFoundError``); the first test proves the block holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli.registry import COMMANDS
from jobs.runtime.messages import SPARK_EXTRA
from tests.cli_helpers import REPO, error_lines
from tests.integration.test_executor_cli import _metadata_only_cluster

BLOCK = '''
import sys

class _NotInstalled:
    """A meta-path finder in front of the others: these packages "are not installed"."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"pyspark", "delta", "py4j"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
'''


@pytest.fixture(scope="module")
def no_spark_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("no-spark")
    (site / "sitecustomize.py").write_text(BLOCK)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), str(REPO), env.get("PYTHONPATH", "")) if p
    )
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_block_makes_pyspark_unimportable(no_spark_env: dict[str, str]) -> None:
    code = "import importlib, sys; importlib.import_module(sys.argv[1])"
    for module in ("pyspark", "pyspark.sql", "delta"):
        proc = _run(no_spark_env, "-c", code, module)
        assert proc.returncode == 1, proc.stderr
        assert "ModuleNotFoundError" in proc.stderr
    # ...while this venv does have them: the block, not the venv, is what the tests exercise.
    assert _run(dict(os.environ), "-c", code, "pyspark.sql").returncode == 0


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_every_command_works_without_pyspark(
    no_spark_env: dict[str, str], command: str
) -> None:
    proc = _run(no_spark_env, "-m", "jobs.cli", command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith("usage: "), proc.stdout[:200]
    assert "--" in proc.stdout  # flags are listed, not just the usage line


def test_top_level_help_works_without_pyspark(no_spark_env: dict[str, str]) -> None:
    proc = _run(no_spark_env, "-m", "jobs.cli", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--log-format" in proc.stdout and "audit" in proc.stdout


def test_local_executor_works_and_spark_names_the_extra(
    no_spark_env: dict[str, str], zk_chroot: str, tmp_path: Path
) -> None:
    _metadata_only_cluster(zk_chroot, 12)
    wh = str(tmp_path / "wh")
    base = ("-m", "jobs.cli", "audit", "--zk", zk_chroot, "--warehouse", wh, "--check", "lost")

    proc = _run(no_spark_env, *base, "--executor", "local")
    assert proc.returncode == 0, proc.stderr
    assert "COMPLETED" in proc.stdout and "12 ledgers" in proc.stdout, proc.stdout

    # auto above local-max-ledgers would pick Spark; without it, it runs locally and says why.
    proc = _run(no_spark_env, "-m", "jobs.cli", "-v", *base[2:], "--local-max-ledgers", "5")
    assert proc.returncode == 0, proc.stderr
    assert "COMPLETED" in proc.stdout and "12 ledgers" in proc.stdout, proc.stdout
    assert "executor local (12 ledgers > local-max-ledgers 5, but pyspark is not installed)" in (
        proc.stderr
    )

    # The report is read through delta-rs: no Spark either (exit 1: findings exist).
    proc = _run(no_spark_env, "-m", "jobs.cli", "listunderreplicated", "--warehouse", wh)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr

    for args in (
        (*base, "--executor", "spark"),
        (
            *("-m", "jobs.cli", "rereplicate", "--zk", zk_chroot, "--warehouse", wh),
            *("--executor", "spark", "--dry-run"),
        ),
    ):
        proc = _run(no_spark_env, *args)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        lines = error_lines(proc)
        assert len(lines) == 1, proc.stderr
        assert SPARK_EXTRA in lines[0] and "pyspark is not installed" in lines[0], lines
