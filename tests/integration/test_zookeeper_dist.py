"""The ZooKeeper server jars come from a Maven repository, pinned and checksum-verified, and a
machine without Java gets one line from ``sandbox up`` and ``demo``, never a traceback."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bklib.maven import MAVEN_CENTRAL, FetchError
from bklib.testing.zookeeper_dist import (
    ZOOKEEPER_SERVER,
    fetch_zookeeper,
    is_complete,
    zookeeper_lib,
)
from tests.cli_helpers import REPO, one_error_line


class _Mirror(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        type(self).requests.append(self.path)


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """A Maven-layout repository on a loopback HTTP server, holding the pinned jars."""
    root = tmp_path / "repo"
    for art in ZOOKEEPER_SERVER:
        dest = root / art.url("").lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(zookeeper_lib() / art.filename, dest)
    requests: list[str] = []
    handler = type("Handler", (_Mirror,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root, requests
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_verifies_every_jar_and_fetches_once(
    mirror: tuple[str, Path, list[str]], tmp_path: Path
) -> None:
    url, _, requests = mirror
    lib = tmp_path / "cache" / "zookeeper" / "lib"
    seen: list[str] = []
    assert fetch_zookeeper(lib, repository=url, fetched=lambda a: seen.append(a.filename)) == lib
    assert is_complete(lib)
    assert sorted(seen) == sorted(a.filename for a in ZOOKEEPER_SERVER)
    assert sorted(p.name for p in lib.glob("*.jar")) == sorted(seen)
    assert len(requests) == len(ZOOKEEPER_SERVER)
    fetch_zookeeper(lib, repository=url)  # cached: nothing asked again
    assert len(requests) == len(ZOOKEEPER_SERVER)


def test_a_jar_with_another_checksum_is_refused_and_the_cache_kept(
    mirror: tuple[str, Path, list[str]], tmp_path: Path
) -> None:
    url, root, _ = mirror
    victim = ZOOKEEPER_SERVER[0]
    with (root / victim.url("").lstrip("/")).open("ab") as f:
        f.write(b"tampered")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "old.jar").write_bytes(b"previous")
    with pytest.raises(FetchError, match=rf"{victim.filename}: SHA-256 .* is not the pinned"):
        fetch_zookeeper(lib, repository=url)
    assert [p.name for p in lib.iterdir()] == ["old.jar"]  # left as it was
    assert not is_complete(lib)
    assert not [p for p in lib.parent.iterdir() if p.name.startswith(".zookeeper-")]


def test_a_missing_jar_names_its_url(mirror: tuple[str, Path, list[str]], tmp_path: Path) -> None:
    url, root, _ = mirror
    victim = ZOOKEEPER_SERVER[-1]
    (root / victim.url("").lstrip("/")).unlink()
    with pytest.raises(FetchError, match=rf"could not fetch {url}/.*/{victim.filename}: HTTP"):
        fetch_zookeeper(tmp_path / "lib", repository=url)


def test_the_pins_are_what_maven_central_serves(tmp_path: Path) -> None:
    lib = fetch_zookeeper(tmp_path / "lib", repository=MAVEN_CENTRAL)
    assert is_complete(lib)


@pytest.mark.parametrize("argv", [["sandbox", "up", "--bookies", "1"], ["demo"]])
def test_without_java_sandbox_and_demo_say_so_in_one_line(argv: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env.update(PATH=str(empty), PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", *argv, "--dir", str(tmp_path / "sb")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "java not found on PATH" in one_error_line(proc)
    assert not (tmp_path / "sb").exists()
