"""The README is a newcomer's page, and its install line works as written.

The block between the README's ``install-line`` markers runs verbatim in bash. It runs in a copy
of the checkout's tracked files, with a fresh HOME, the suite's Python as ``python3`` and
Java on PATH. It creates a virtualenv, ``pip install .``, prints ``bkaudit --version`` and
tells the demo's story. Afterwards the copy is deleted, and the installed ``bkaudit`` still
answers from another directory: nothing it runs comes from the checkout. Two shared caches stay
reachable so the run is quick: pip's cache (``PIP_CACHE_DIR``) and bkaudit's download cache
(``BKAUDIT_CACHE``, ZooKeeper's pinned jars). PyPI, or the index ``PIP_INDEX_URL`` names,
must be reachable.

The README's length, its command table (the registry's rendering), ``bkaudit --version`` and
the watch's start line are checked here too; none of those starts a server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from bklib.testing.ports import free_port
from jobs.cli.registry import COMMANDS
from tests.cli_helpers import REPO, failure

pytestmark = pytest.mark.integration

README = REPO / "README.md"
MAX_README_LINES = 250
BEGIN = "<!-- install-line"
END = "<!-- /install-line -->"


def package_version() -> str:
    """The one written version: ``pyproject.toml``'s static ``version``."""
    with open(REPO / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def install_block(readme: str) -> str:
    """The fenced bash block between the install-line markers, as written."""
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, "one install-line block"
    marked = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    m = re.search(r"^```bash\n(.*?)^```$", marked, re.S | re.M)
    assert m, "the install-line markers hold no ```bash block"
    return m.group(1)


def command_table() -> str:
    """The README's command table, rendered from :mod:`jobs.cli.registry`."""
    rows = ["| command | what it does | for example |", "|---|---|---|"]
    for cmd in COMMANDS.values():
        summary = cmd.summary.replace("|", "\\|")
        example = cmd.examples[0].replace("|", "\\|")
        rows.append(f"| `bkaudit {cmd.name}` | {summary} | `{example}` |")
    return "\n".join(rows)


def test_the_readme_is_under_250_lines() -> None:
    lines = README.read_text().count("\n")
    assert lines < MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_command_table_is_the_registry_rendering() -> None:
    section = README.read_text().split("\n## Commands\n", 1)[1].lstrip("\n")
    table = section.split("\n\n", 1)[0]
    assert table == command_table(), "README's command table, rendered:\n" + command_table()


def test_every_docs_link_in_the_readme_exists() -> None:
    links = re.findall(r"\]\(((?:docs/|conf/)?[\w./-]+\.(?:md|yaml))\)", README.read_text())
    assert links
    missing = sorted({link for link in links if not (REPO / link).is_file()})
    assert not missing, f"README links to files that do not exist: {missing}"


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"bkaudit {package_version()}\n"


def test_the_watch_logs_its_version_at_start(tmp_path: Path) -> None:
    # Nothing listens on the port: the watch logs its start line, then fails to connect (2).
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "watch", "--zk", f"127.0.0.1:{free_port()}",
         "--warehouse", str(tmp_path / "wh"), "--metrics-port", "0",
         "--metrics-host", "127.0.0.1", "--zk-session-timeout", "2s", "--connect-timeout", "1s",
         "--instance-id", "w1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, failure(proc)
    assert f"watch: bkaudit {package_version()}, w1 on " in proc.stderr, failure(proc)


def copy_checkout(dest: Path) -> None:
    """The checkout's tracked files as they are in the working tree (symlinks kept), as a
    newcomer's clone of this commit would hold them, without the virtualenvs and caches."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, names.split("\0")):
        src = REPO / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree, not yet committed
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)


def newcomer_env(home: Path, bin_dir: Path) -> dict[str, str]:
    """A fresh HOME; the suite's Python as ``python3`` first on PATH, then the machine's
    (Java included); no virtualenv and no bkaudit settings of the suite; the shared caches."""
    shared_pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    shared_bkaudit_cache = os.environ.get("BKAUDIT_CACHE") or str(
        Path.home() / ".cache" / "bkaudit"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "BKAUDIT_", "XDG_"))
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and str(REPO) not in p]
    env.update(
        HOME=str(home),
        PATH=os.pathsep.join([str(bin_dir), *path]),
        PIP_CACHE_DIR=shared_pip_cache,
        BKAUDIT_CACHE=shared_bkaudit_cache,
        BKAUDIT_PROGRESS="off",
    )
    return env


@pytest.mark.timeout(1800)
def test_the_readme_install_line_as_written(tmp_path: Path) -> None:
    script = install_block(README.read_text())
    assert "pip install" in script and "bkaudit demo" in script
    checkout, home, bin_dir, elsewhere = (tmp_path / d for d in ("bkaudit", "home", "bin", "x"))
    for d in (home, bin_dir, elsewhere):
        d.mkdir()
    copy_checkout(checkout)
    # The suite's interpreter (a venv's python resolves to the one it was made from).
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    env = newcomer_env(home, bin_dir)

    proc = subprocess.run(
        ["bash", "-euxo", "pipefail", "-c", script], cwd=checkout, env=env,
        capture_output=True, text=True, timeout=1700, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, failure(proc)
    version = package_version()
    assert f"\nbkaudit {version}\n" in f"\n{proc.stdout}", failure(proc)
    assert "re-audit clean, every entry read" in proc.stdout, failure(proc)
    # Without the spark extra the demo's Spark step runs locally, and says why.
    note = "[5/9] bkaudit audit --check replicas --executor local (pyspark is not installed"
    assert note in proc.stdout, failure(proc)
    assert "Traceback" not in proc.stderr, failure(proc)

    # The checkout gone, the installed bkaudit still answers, from its own files.
    shutil.rmtree(checkout)
    venvs = [p.parent.parent for p in home.glob("*/bin/bkaudit")]
    assert len(venvs) == 1, f"the install line made no one virtualenv under HOME: {venvs}"
    bkaudit = venvs[0] / "bin" / "bkaudit"
    again = subprocess.run(
        [str(bkaudit), "--version"], cwd=elsewhere, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0 and again.stdout == f"bkaudit {version}\n", failure(again)
    where = subprocess.run(
        [str(venvs[0] / "bin" / "python"), "-c", "import bklib, jobs; print(bklib.__file__); "
         "print(jobs.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    assert all(Path(w).is_relative_to(venvs[0]) for w in where), where
