"""bkaudit as a user gets it: ``pip install .`` into a fresh virtualenv (no ``spark`` extra, no
checkout on the path, run from another directory). Without Java it says so in one line and
exits 2; with Java, the README's install line and its demo are test_install_line.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import REPO, one_error_line

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(REPO)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-4000:]
    yield venv


def _env(venv: Path, *, java: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["BKAUDIT_PROGRESS"] = "off"
    if not java:
        # A machine without Java: nothing on PATH but the venv, no JAVA_HOME.
        env["PATH"] = str(venv / "bin")
        env.pop("JAVA_HOME", None)
    return env


def _bkaudit(
    venv: Path, cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "bkaudit"), *args], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=900, check=False,
    )  # fmt: skip


def test_the_installed_package_is_not_the_checkout(fresh_venv: Path, tmp_path: Path) -> None:
    code = "import jobs, importlib.util as u; print(jobs.__file__); print(u.find_spec('pyspark'))"
    proc = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-c", code], cwd=tmp_path,
        env=_env(fresh_venv, java=True), capture_output=True, text=True, check=True,
    )  # fmt: skip
    where, pyspark = proc.stdout.split()
    assert Path(where).is_relative_to(fresh_venv) and pyspark == "None", proc.stdout
    # The Spark defaults travel with the package (an image's Spark job reads them).
    assert (Path(where).parent / "spark" / "spark-defaults.conf").read_text() == (
        REPO / "conf" / "spark-defaults.conf"
    ).read_text()


@pytest.mark.parametrize("command", [("demo",), ("sandbox", "up", "--dir", "sb")])
def test_without_java_one_line_and_exit_2(
    fresh_venv: Path, tmp_path: Path, command: tuple[str, ...]
) -> None:
    proc = _bkaudit(fresh_venv, tmp_path, _env(fresh_venv, java=False), *command)
    assert "java not found on PATH" in one_error_line(proc), proc.stderr
