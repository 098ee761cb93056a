"""A real S3-compatible server (s3proxy) on a free loopback port, for tests and benchmarks.

The warehouse may live on object storage (docs/tables.md). The tests need a server that does
what S3 does where it matters to Delta: a commit is a PUT of ``_delta_log/NNN.json`` with
``If-None-Match: *``, and of two writers racing for one version exactly one may win (412 for
the other); and a listing of ``_delta_log/`` shows every commit that was written before it (a
reader that sees version 5 but not 4 fails: "Expected contiguous commit files"). s3proxy
(Apache-2.0, ``org.gaul:s3proxy`` on Maven Central) with its ``filesystem-nio2`` backend does
both since 4.1.0: 4.0.0 creates atomically but listed keys written a moment before with gaps
(tests/integration/test_object_store.py found it), and earlier versions checked and then
wrote. A bucket is a directory under the server's base directory.

The jar (with its dependencies, 98 MB) is fetched once into ``$BKAUDIT_CACHE/s3proxy/<version>``
by ``python -m bklib.testing.s3server`` (``make s3-deps``); :class:`S3Server` runs it with
static credentials of its own, path-style, plain HTTP on loopback.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bklib.maven import Artifact, cache_dir, fetch_artifacts, is_complete
from bklib.testing.ports import free_port
from bklib.testing.zkserver import terminate

__all__ = ["S3PROXY", "S3Server", "S3Unavailable", "fetch_s3proxy", "s3proxy_jar"]

log = logging.getLogger(__name__)

S3PROXY_VERSION = "4.1.0"
S3PROXY = Artifact(
    "org.gaul",
    "s3proxy",
    S3PROXY_VERSION,
    "jar-with-dependencies",
    "a4d025969aaf796616ed4b1e2491d87d455ce84bb28cb9db086b2e6aaa68b48d",
)

REGION = "us-east-1"
"""The region the server says it is in (s3proxy answers any, signs with this one)."""


class S3Unavailable(RuntimeError):
    """The s3proxy jar or Java is missing, or the server did not come up; says why."""


def s3proxy_dir() -> Path:
    """Where the pinned jar is cached."""
    return cache_dir() / "s3proxy" / S3PROXY_VERSION


def s3proxy_jar() -> Path:
    """The cached jar (fetched by :func:`fetch_s3proxy`)."""
    return s3proxy_dir() / S3PROXY.filename


def fetch_s3proxy(timeout: float = 120.0) -> Path:
    """Fetch the pinned jar if it is not cached yet (its SHA-256 checked); returns its path."""
    fetch_artifacts([S3PROXY], s3proxy_dir(), timeout=timeout)
    return s3proxy_jar()


@dataclass
class S3Server:
    """s3proxy serving the buckets under ``base_dir / "buckets"`` on a free loopback port,
    with static credentials; its log is ``base_dir / "s3proxy.log"``."""

    base_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    access_key: str = "bkaudit-test-access"
    secret_key: str = "bkaudit-test-secret-0123456789"
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        """``http://HOST:PORT``, what ``AWS_ENDPOINT_URL`` names."""
        return f"http://{self.host}:{self.port}"

    @property
    def buckets(self) -> Path:
        return self.base_dir / "buckets"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a client of this server is given (the credential chain's
        environment step): endpoint, region, keys, plain HTTP allowed."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ALLOW_HTTP": "true",
        }

    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options for this server (the same facts as :meth:`env`), with
        path-style addressing: a bucket name is not a host name on loopback."""
        return {**self.env(), "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (a directory of the backend); returns ``s3://name``."""
        (self.buckets / name).mkdir(parents=True, exist_ok=True)
        return f"s3://{name}"

    def start(self, timeout: float = 60.0) -> S3Server:
        """Start the server and wait until it answers HTTP."""
        jar = s3proxy_jar()
        if not jar.is_file():
            raise S3Unavailable(f"s3proxy not found at {jar}; run make s3-deps")
        java = shutil.which("java")
        if java is None:
            raise S3Unavailable("java not found: s3proxy needs a Java 17 runtime")
        self.port = self.port or free_port(self.host)
        self.buckets.mkdir(parents=True, exist_ok=True)
        props = self.base_dir / "s3proxy.properties"
        props.write_text(
            "\n".join(
                [
                    f"s3proxy.endpoint=http://{self.host}:{self.port}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={self.access_key}",
                    f"s3proxy.credential={self.secret_key}",
                    "jclouds.provider=filesystem-nio2",
                    f"jclouds.filesystem.basedir={self.buckets}",
                    f"jclouds.regions={REGION}",
                ]
            )
            + "\n"
        )
        props.chmod(0o600)  # the secret key
        out = (self.base_dir / "s3proxy.log").open("ab")
        try:
            # -XX:-UsePerfData: no hsperfdata file mapped in /tmp, whose filling up would
            # crash the JVM (SIGBUS) in the middle of a run.
            self.proc = subprocess.Popen(
                [
                    java,
                    "-Xmx256m",
                    "-XX:-UsePerfData",
                    "-jar",
                    str(jar),
                    "--properties",
                    str(props),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        finally:
            out.close()
        self._wait_serving(timeout)
        log.info("s3proxy up at %s (buckets in %s)", self.endpoint, self.buckets)
        return self

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise S3Unavailable(f"s3proxy exited ({self.proc.returncode}): {self._tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as s:
                    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    # Ours only: another process's HTTP server that took the port between its
                    # choice and the JVM's bind would answer too, and s3proxy would then exit.
                    if s.recv(12).startswith(b"HTTP/") and self._listening():
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise S3Unavailable(f"s3proxy did not answer in {timeout:g}s: {self._tail()}")

    def _listening(self) -> bool:
        """Whether the server's own process listens on its port."""
        import psutil  # the test tools' (pyproject's dev extra), not bkaudit's

        assert self.proc is not None
        try:
            conns = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except psutil.Error:
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in conns)

    def check_running(self) -> None:
        """Raise :class:`S3Unavailable` with the exit status and the log's end if the server
        has stopped (a test that finds its store gone says why, not only "refused")."""
        if self.proc is None:
            raise S3Unavailable(f"s3proxy at {self.endpoint} is not started")
        code = self.proc.poll()
        if code is not None:
            raise S3Unavailable(f"s3proxy at {self.endpoint} exited ({code}): {self._tail()}")

    def _tail(self) -> str:
        path = self.base_dir / "s3proxy.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return text[-2000:]

    def stop(self) -> None:
        """Stop the server (its buckets stay on disk)."""
        if self.proc is not None:
            terminate(self.proc, 10)
            self.proc = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bklib.testing.s3server``: fetch the pinned s3proxy jar if it is missing."""
    argparse.ArgumentParser(description="Fetch the pinned s3proxy jar.").parse_args(argv)
    if is_complete(s3proxy_dir(), [S3PROXY]):
        return 0
    print(f"fetching s3proxy {S3PROXY_VERSION} into {s3proxy_dir()}", file=sys.stderr)
    fetch_s3proxy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
