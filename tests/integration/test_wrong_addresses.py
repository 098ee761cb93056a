"""Wrong addresses fail fast, with the real cause, in one line (issue 47, item 4;
docs/operations.md, "Wrong addresses").

Each case runs the real ``bkaudit`` in a subprocess against real endpoints: an unused port
(refused), a ``.invalid`` name (RFC 6761: never resolves), a listening socket whose accept
queue is full (a SYN that is never answered: timed out, as an unroutable address or a
dropping firewall), a real ZooKeeper, a real Oxia, a read-only file system (a tmpfs mounted
read-only in a user namespace of its own) and delta-rs's own S3 client. The one timed
assertion the issue asks for: a refused port and a name that does not resolve are said in
under 5 s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from bklib.meta.stores.zookeeper.connect_string import CONNECT_STRING_FORMS
from bklib.meta.uri import METADATA_URI_FORMS
from bklib.testing.oxiaserver import OxiaServer
from bklib.testing.ports import free_port
from jobs.options.warehouse import WAREHOUSE_FORMS
from jobs.runtime.messages import SPARK_EXTRA
from tests.cli_helpers import REPO, bkaudit, byte_compile, failure, one_error_line
from tests.integration.test_executor_cli import _metadata_only_cluster
from tests.integration.test_without_spark import BLOCK as NO_SPARK_BLOCK
from tests.objectstore.conftest import no_aws_env

pytestmark = pytest.mark.integration

FAST = 5.0
"""Seconds within which a refused port or an unknown name is said (process start included)."""

DNS_TYPO = "zk1.bkaudit-typo.invalid"

LIBRARY_NOISE = ("kazoo", "WARNING", "aws_config", "panicked", "Traceback", "ZooKeeper budget")
"""What must not reach the terminal at default verbosity."""


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    """The checkout byte-compiled, as an installed package is: under PYTHONDONTWRITEBYTECODE
    every process would compile bkaudit's modules again, which no operator's start pays."""
    byte_compile()


def _timed(*args: str, env: Mapping[str, str] | None = None) -> tuple[str, float, str]:
    """Run ``bkaudit ARGS``: (its one error line, seconds, its stderr). Asserts exit 2, one
    line and none of :data:`LIBRARY_NOISE`."""
    start = time.monotonic()
    proc = bkaudit(*args, env=env)
    elapsed = time.monotonic() - start
    line = one_error_line(proc)
    noise = [word for word in LIBRARY_NOISE if word in proc.stderr]
    assert not noise, failure(proc, f"library output at default verbosity: {noise}")
    return line, elapsed, proc.stderr


def _audit(store: list[str], warehouse: str | Path, *more: str) -> list[str]:
    return ["audit", *store, "--warehouse", str(warehouse), "--check", "lost", *more]


# ---- ZooKeeper ---------------------------------------------------------------------------------


def test_a_refused_zookeeper_port_is_said_at_once(tmp_path: Path) -> None:
    port = free_port()
    line, elapsed, _ = _timed(*_audit(["--zk", f"127.0.0.1:{port}"], tmp_path / "wh"))
    assert f"cannot connect to ZooKeeper at 127.0.0.1:{port}: connection refused" in line, line
    assert elapsed < FAST, elapsed
    assert not (tmp_path / "wh").exists()


def test_a_zookeeper_name_that_does_not_resolve_is_said_at_once(tmp_path: Path) -> None:
    line, elapsed, _ = _timed(*_audit(["--zk", f"{DNS_TYPO}:2181/pulsar"], tmp_path / "wh"))
    assert f"cannot connect to ZooKeeper at {DNS_TYPO}:2181: name not found" in line, line
    assert elapsed < FAST, elapsed


def test_every_server_of_the_connect_string_is_named_with_its_cause(tmp_path: Path) -> None:
    port = free_port()
    zk = f"{DNS_TYPO}:2181,127.0.0.1:{port}"
    line, _, _ = _timed(*_audit(["--metadata-uri", f"zk://{zk.replace(',', ';')}/ledgers"],
                                tmp_path / "wh"))  # fmt: skip
    assert f"{DNS_TYPO}:2181: name not found" in line, line
    assert f"127.0.0.1:{port}: connection refused" in line, line


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener never accepts and whose queue is full: the kernel drops new
    SYNs, so a connect neither succeeds nor is refused (an unroutable address, a firewall)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held = []
    for _ in range(8):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        held.append(filler)
    time.sleep(0.2)  # the handshakes the queue takes are done
    try:
        yield port
    finally:
        for s in (*held, server):
            s.close()


def test_an_address_that_never_answers_is_said_timed_out(tmp_path: Path, silent_port: int) -> None:
    line, elapsed, _ = _timed(*_audit(["--zk", f"127.0.0.1:{silent_port}"], tmp_path / "wh"))
    assert f"127.0.0.1:{silent_port}: timed out after" in line, line
    # One bounded connect (bklib.meta.stores.reachability.CONNECT_TIMEOUT), not kazoo's 30 s.
    assert elapsed < 20, elapsed


def test_the_zookeeper_budget_line_is_debug_only(tmp_path: Path) -> None:
    store = ["--zk", f"127.0.0.1:{free_port()}"]
    _timed(*_audit(store, tmp_path / "wh"))  # asserts no "ZooKeeper budget" line
    verbose = bkaudit("-v", *_audit(store, tmp_path / "wh"))
    assert verbose.returncode == 2, failure(verbose)
    assert "ZooKeeper budget: " in verbose.stderr, failure(verbose)


# ---- typos ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "forms"),
    [
        (["--zk", "zk1:21810x"], CONNECT_STRING_FORMS),
        (["--zk", "zk1:2181:2182"], CONNECT_STRING_FORMS),
        (["--metadata-uri", "metadata-store:zookeeper:zk1:2181"], METADATA_URI_FORMS),
        (["--metadata-uri", "zookeeper://zk1:2181/ledgers"], METADATA_URI_FORMS),
        (["--metadata-uri", "zk://zk1:99999/ledgers"], METADATA_URI_FORMS),
        (["--metadata-uri", "metadata-store:oxia://zk1/ns"], METADATA_URI_FORMS),
    ],
    ids=["zk-port", "zk-two-ports", "pulsar-zookeeper", "scheme", "uri-port", "oxia-no-port"],
)
def test_a_store_address_typo_is_one_line_naming_the_forms(
    tmp_path: Path, flags: list[str], forms: str
) -> None:
    line, _, _ = _timed(*_audit(flags, tmp_path / "wh"))
    assert forms in line and "ValueError" not in line, line


@pytest.mark.parametrize("warehouse", ["s3a:/ops/bkaudit", "s3b://ops/bkaudit", "s3a://"])
def test_a_warehouse_typo_is_one_line_naming_the_forms(warehouse: str) -> None:
    line, _, _ = _timed(*_audit(["--zk", f"127.0.0.1:{free_port()}"], warehouse))
    assert WAREHOUSE_FORMS in line and repr(warehouse) in line, line


# ---- the executor --------------------------------------------------------------------------------


def test_executor_spark_without_pyspark_is_said_before_the_cluster(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_SPARK_BLOCK)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    # The ZooKeeper port is refused: the line is about pyspark, so it was checked first.
    store = ["--zk", f"127.0.0.1:{free_port()}"]
    line, elapsed, _ = _timed(*_audit(store, tmp_path / "wh", "--executor", "spark"), env=env)
    assert line == f"audit: pyspark is not installed; Spark needs the spark extra: {SPARK_EXTRA}"
    assert elapsed < FAST, elapsed


def test_executor_spark_without_java_is_said_before_the_cluster(tmp_path: Path) -> None:
    # No java on PATH (an empty directory) nor in $JAVA_HOME.
    env = {"PATH": str(tmp_path), "JAVA_HOME": str(tmp_path / "no-jdk")}
    store = ["--zk", f"127.0.0.1:{free_port()}"]
    line, _, _ = _timed(*_audit(store, tmp_path / "wh", "--executor", "spark"), env=env)
    assert "needs a Java runtime" in line, line


# ---- the warehouse -------------------------------------------------------------------------------


def test_a_warehouse_that_is_a_file_is_said_before_the_scan(tmp_path: Path, zk_chroot: str) -> None:
    # A real ZooKeeper with no cluster in the chroot: had the store been read first, the
    # line would be about the missing cluster.
    (tmp_path / "wh").write_text("not a directory")
    for command in (
        _audit(["--zk", zk_chroot], tmp_path / "wh"),
        ["rereplicate", "--zk", zk_chroot, "--warehouse", str(tmp_path / "wh")],
        ["blastradius", "--zk", zk_chroot, "--warehouse", str(tmp_path / "wh" / "sub")],
    ):
        line, _, _ = _timed(*command)
        assert f"warehouse {tmp_path / 'wh'}" in line and "not a directory" in line, line


def _with_mounts(mounts: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``bkaudit ARGV`` in a user and mount namespace of its own, after the shell commands
    ``mounts`` (root ignores file modes: only a mount can refuse it a write)."""
    assert shutil.which("unshare"), "unshare (util-linux) is needed for mounts of a test's own"
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", f'{mounts} && exec "$0" -m jobs.cli "$@"',
         sys.executable, *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _read_only(directory: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``bkaudit ARGV`` where ``directory`` is mounted read-only over itself."""
    mounts = f'mount --bind "{directory}" "{directory}" && mount -o remount,bind,ro "{directory}"'
    return _with_mounts(mounts, argv)


def test_a_read_only_warehouse_is_one_line_without_rust_panics(
    tmp_path: Path, zk_chroot: str
) -> None:
    # Its tables exist (a first audit wrote them): appending to them through delta-rs is
    # what panicked ("Already shut down", object_store's buffered writer) after the scan.
    _metadata_only_cluster(zk_chroot, 5)
    wh = tmp_path / "wh"
    argv = _audit(["--zk", zk_chroot], wh, "--executor", "local")
    first = bkaudit(*argv)
    assert first.returncode == 0, failure(first)
    proc = _read_only(wh, argv)
    line = one_error_line(proc)
    assert f"warehouse {wh} is not writable" in line and "Read-only file system" in line, line
    assert "panicked" not in proc.stderr and "metadata scan" not in proc.stderr, proc.stderr
    # A directory that does not exist yet, under a read-only one, is said as well.
    proc = _read_only(tmp_path, _audit(["--zk", zk_chroot], tmp_path / "new-wh"))
    assert "is not writable" in one_error_line(proc)


def _full(warehouse: Path, tables: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``bkaudit ARGV`` where ``warehouse`` is a 1 MB tmpfs holding a copy of ``tables`` and
    then filled to the last page: the probe's empty file still fits, the run's first Parquet
    file does not (a disk that fills up mid-run)."""
    mounts = (
        f'mount -t tmpfs -o size=1m tmpfs "{warehouse}" && cp -a "{tables}/." "{warehouse}/" '
        f'&& {{ dd if=/dev/zero of="{warehouse}/filler" bs=4k 2>/dev/null || true; }}'
    )
    return _with_mounts(mounts, argv)


def test_a_warehouse_that_fills_up_mid_run_is_one_line_without_rust_panics(
    tmp_path: Path, zk_chroot: str
) -> None:
    """The warehouse passes the probe, then its disk is full when the run's findings are
    written: delta-rs panics on its way out ("Already shut down"), and the operator sees only
    the one line naming the table and the cause. With -v the panic report is shown."""
    _metadata_only_cluster(zk_chroot, 5)
    tables, wh = tmp_path / "tables", tmp_path / "wh"
    wh.mkdir()
    first = bkaudit(*_audit(["--zk", zk_chroot], tables, "--executor", "local"))
    assert first.returncode == 0, failure(first)
    argv = _audit(["--zk", zk_chroot], wh, "--executor", "local")
    proc = _full(wh, tables, argv)
    line = one_error_line(proc)
    assert f"Delta table {wh}" in line and "No space left on device" in line, line
    assert "panicked" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    # The same failure, verbose: the report is delta-rs's own, so it is there to be shown.
    verbose = _full(wh, tables, ["-v", *argv])
    assert verbose.returncode == proc.returncode, failure(verbose)
    assert "panicked" in verbose.stderr, verbose.stderr[-4000:]


def _bkaudit_env(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args],
        cwd=REPO, capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip


def test_an_s3a_warehouse_without_credentials_is_one_line_without_aws_logs() -> None:
    env = no_aws_env()
    argv = _audit(["--zk", f"127.0.0.1:{free_port()}"], "s3a://bkaudit-test/wh")
    proc = _bkaudit_env(env, *argv)
    line = one_error_line(proc)
    assert "warehouse s3a://bkaudit-test/wh cannot be reached: no credentials" in line, line
    for word in LIBRARY_NOISE:
        assert word not in proc.stderr, failure(proc, word)
    # -v shows what the probe's AWS client (botocore) logged on the way.
    verbose = _bkaudit_env(env, "-v", *argv)
    assert verbose.returncode == 2, failure(verbose)
    assert "botocore.credentials" in verbose.stderr, failure(verbose)


def test_an_unreachable_s3_endpoint_is_said_refused(tmp_path: Path) -> None:
    env = no_aws_env()
    env.update(
        AWS_ACCESS_KEY_ID="bkaudit", AWS_SECRET_ACCESS_KEY="bkaudit-secret",
        AWS_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        AWS_ALLOW_HTTP="true",
    )  # fmt: skip
    proc = _bkaudit_env(env, *_audit(["--zk", f"127.0.0.1:{free_port()}"], "s3a://ops/wh"))
    line = one_error_line(proc)
    assert "warehouse s3a://ops/wh cannot be reached" in line, line
    assert "Connection refused" in line, line


# ---- Oxia ----------------------------------------------------------------------------------------


def test_a_refused_oxia_port_is_said_at_once(tmp_path: Path) -> None:
    port = free_port()
    uri = f"metadata-store:oxia://127.0.0.1:{port}/default"
    line, elapsed, _ = _timed(*_audit(["--metadata-uri", uri], tmp_path / "wh"))
    assert f"cannot connect to Oxia at 127.0.0.1:{port}: connection refused" in line, line
    assert elapsed < FAST, elapsed


def test_an_oxia_name_that_does_not_resolve_is_said_at_once(tmp_path: Path) -> None:
    uri = f"metadata-store:oxia://{DNS_TYPO}:6648/default"
    line, elapsed, _ = _timed(*_audit(["--metadata-uri", uri], tmp_path / "wh"))
    assert f"cannot connect to Oxia at {DNS_TYPO}:6648: name not found" in line, line
    assert elapsed < FAST, elapsed


def test_an_oxia_namespace_the_server_does_not_serve_is_said_at_once(
    oxia_server: OxiaServer, tmp_path: Path
) -> None:
    uri = oxia_server.uri("no-such-namespace")
    line, elapsed, _ = _timed(*_audit(["--metadata-uri", uri], tmp_path / "wh"))
    assert "does not serve namespace 'no-such-namespace'" in line, line
    assert elapsed < FAST, elapsed
    # Never the ZooKeeper budget on Oxia, not even with -v.
    verbose = bkaudit("-v", *_audit(["--metadata-uri", uri], tmp_path / "wh"))
    assert verbose.returncode == 2, failure(verbose)
    assert "ZooKeeper budget" not in verbose.stderr, failure(verbose)
