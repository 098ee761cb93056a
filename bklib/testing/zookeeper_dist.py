"""The ZooKeeper server jars the sandbox, the demo and the tests run, fetched from Maven Central.

The artifacts are pinned here, each with the SHA-256 of the file Maven Central serves, so a
``pip install`` of bkaudit needs only Java to run ``bkaudit sandbox up`` or ``bkaudit demo``.
The jars land in ``$BKAUDIT_CACHE/zookeeper/lib`` (what :func:`zookeeper_lib` names), complete
or not at all: they are downloaded into a temporary directory that replaces the old one only
when every checksum matched.

``python -m bklib.testing.zookeeper_dist`` fetches them (``make java-deps`` does).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MAVEN_CENTRAL",
    "REPOSITORY_ENV",
    "ZOOKEEPER_SERVER",
    "ZOOKEEPER_VERSION",
    "Artifact",
    "FetchError",
    "cache_dir",
    "fetch_zookeeper",
    "is_complete",
    "zookeeper_lib",
]

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
REPOSITORY_ENV = "BKAUDIT_MAVEN_REPOSITORY"
"""A Maven repository to fetch from instead of Maven Central (a mirror or proxy)."""

ZOOKEEPER_VERSION = "3.9.3"


@dataclass(frozen=True)
class Artifact:
    """One jar in a Maven repository, with the SHA-256 it must have."""

    group: str
    artifact: str
    version: str
    classifier: str
    sha256: str

    @property
    def filename(self) -> str:
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.jar"

    def url(self, repository: str) -> str:
        """Where the jar is in a repository laid out as Maven's."""
        group = self.group.replace(".", "/")
        return f"{repository.rstrip('/')}/{group}/{self.artifact}/{self.version}/{self.filename}"


# The server's runtime classpath: ZooKeeper 3.9.3 with the two dependencies its pom marks
# optional but the server needs (metrics-core, snappy-java) and slf4j-simple for its log.
ZOOKEEPER_SERVER: tuple[Artifact, ...] = (
    Artifact(
        "org.apache.zookeeper",
        "zookeeper",
        ZOOKEEPER_VERSION,
        "",
        "ad6570105768d18382a762325b4460368b7089a5a77c053e682b17942e0e72b5",
    ),
    Artifact(
        "org.apache.zookeeper",
        "zookeeper-jute",
        ZOOKEEPER_VERSION,
        "",
        "be72e2c9099413a9878ce830b65bb22e0be755dc2a22b290550ab9e03b5b4cfa",
    ),
    Artifact(
        "org.apache.yetus",
        "audience-annotations",
        "0.12.0",
        "",
        "ffb101fc066360ff3c77457c927fd7967fb096a6ee9e046ab7071447d8208efc",
    ),
    Artifact(
        "io.dropwizard.metrics",
        "metrics-core",
        "4.1.12.1",
        "",
        "cec34936faa625039f4e46123eccaa10a9eb9d9a40c6075830cd81330e259cf9",
    ),
    Artifact(
        "org.xerial.snappy",
        "snappy-java",
        "1.1.10.5",
        "",
        "0f3f1857ed33116583f480b4df5c0218836c47bfbc9c6221c0d73f356decf37b",
    ),
    Artifact(
        "org.slf4j",
        "slf4j-api",
        "1.7.30",
        "",
        "cdba07964d1bb40a0761485c6b1e8c2f8fd9eb1d19c53928ac0d7f9510105c57",
    ),
    Artifact(
        "org.slf4j",
        "slf4j-simple",
        "1.7.36",
        "",
        "2f39bed943d624dfa8f4102d0571283a10870b6aa36f197a8a506f147010c10f",
    ),
    Artifact(
        "commons-io",
        "commons-io",
        "2.17.0",
        "",
        "4aa4ca48f3dfd30b78220b7881d8cb93eac4093ec94361b6befa9487998a550b",
    ),
    Artifact(
        "io.netty",
        "netty-buffer",
        "4.1.113.Final",
        "",
        "a85c198180a8de997e8f64a62e054946a39af0708466c1bd67747d393d2feee1",
    ),
    Artifact(
        "io.netty",
        "netty-codec",
        "4.1.113.Final",
        "",
        "c7669cbeda2b5c6284627b7ffafd6f1014a96639013b26ebb9d6bcb828f76542",
    ),
    Artifact(
        "io.netty",
        "netty-common",
        "4.1.113.Final",
        "",
        "c0fb22d47111cb06aac2af67fe55e2e216a49fd00e767f4acb7488b280f8c327",
    ),
    Artifact(
        "io.netty",
        "netty-handler",
        "4.1.113.Final",
        "",
        "7a583c4fe5880504d1257a4a6bfe6a635cd34ffe18aab0e4caabbf17d104f172",
    ),
    Artifact(
        "io.netty",
        "netty-resolver",
        "4.1.113.Final",
        "",
        "b2c110a547e7dc6e2b27017ea4ef98416d7d832d2cf40625d0273b90e61df8ab",
    ),
    Artifact(
        "io.netty",
        "netty-tcnative-classes",
        "2.0.66.Final",
        "",
        "669a811a193dc1e7c9ef86cb547a4ab92f0f34cce8f9b842b9029bf5cfa07cc5",
    ),
    Artifact(
        "io.netty",
        "netty-transport",
        "4.1.113.Final",
        "",
        "cb8b97ff77d7c5f1c591c84d2dee3389a0eaa63a3137b7b8c0c64e1dbada6688",
    ),
    Artifact(
        "io.netty",
        "netty-transport-classes-epoll",
        "4.1.113.Final",
        "",
        "f236c66542bbe8c0eeeb464851e190b9432e8ec419ddf6d12d01bcc06f723e5c",
    ),
    Artifact(
        "io.netty",
        "netty-transport-native-unix-common",
        "4.1.113.Final",
        "",
        "804640095390c1284a1ad537207c6d5b391cfb798a7ef976e5b238fcd9c08ea3",
    ),
    Artifact(
        "io.netty",
        "netty-transport-native-epoll",
        "4.1.113.Final",
        "linux-x86_64",
        "22088d3b18f11463496de7c252302e0c9587638333e7e1bf3968d6619db89287",
    ),
)

_CHUNK = 256 * 1024
# Names the manifest: a cache filled from another manifest is fetched again.
_STAMP = (
    ".complete-"
    + hashlib.sha256(
        "\n".join(a.filename + a.sha256 for a in ZOOKEEPER_SERVER).encode()
    ).hexdigest()[:12]
)

Fetched = Callable[[Artifact], None]
"""Called after each jar is downloaded and verified (a progress bar counts them)."""


class FetchError(RuntimeError):
    """A jar could not be fetched, or did not have its pinned checksum; names the URL."""


def cache_dir() -> Path:
    """bkaudit's download cache: ``$BKAUDIT_CACHE``, else ``~/.cache/bkaudit``."""
    return Path(os.environ.get("BKAUDIT_CACHE", Path.home() / ".cache" / "bkaudit"))


def zookeeper_lib() -> Path:
    """Where the ZooKeeper server jars are: ``$BKAUDIT_ZOOKEEPER_LIB``, else the cache's."""
    return Path(os.environ.get("BKAUDIT_ZOOKEEPER_LIB", cache_dir() / "zookeeper" / "lib"))


def is_complete(lib: Path) -> bool:
    """True when ``lib`` holds every pinned jar, fetched and verified by this manifest."""
    return (lib / _STAMP).is_file()


def fetch_zookeeper(
    lib: Path | None = None,
    *,
    repository: str | None = None,
    fetched: Fetched | None = None,
    timeout: float = 60.0,
) -> Path:
    """Make ``lib`` (default :func:`zookeeper_lib`) hold the pinned ZooKeeper server jars and
    return it. Nothing is fetched when it already does. Raises :class:`FetchError` naming the
    URL when a download fails or a checksum differs; ``lib`` is then left as it was."""
    lib = zookeeper_lib() if lib is None else lib
    if is_complete(lib):
        return lib
    repo = repository or os.environ.get(REPOSITORY_ENV) or MAVEN_CENTRAL
    lib.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".zookeeper-", dir=lib.parent))
    try:
        for art in ZOOKEEPER_SERVER:
            _download(art, repo, staging / art.filename, timeout)
            if fetched is not None:
                fetched(art)
        (staging / _STAMP).touch()
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the jars from other users' JVMs
        if lib.exists():
            shutil.rmtree(lib)
        staging.rename(lib)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return lib


def _download(art: Artifact, repository: str, dest: Path, timeout: float) -> None:
    """One jar into ``dest``, checked against its pinned SHA-256."""
    url = art.url(repository)
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, dest.open("wb") as out:
            while chunk := resp.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"could not fetch {url}: {exc}") from None
    if digest.hexdigest() != art.sha256:
        raise FetchError(
            f"{url}: SHA-256 {digest.hexdigest()} is not the pinned {art.sha256}; not used"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bklib.testing.zookeeper_dist [--lib DIR]``: fetch the jars if missing."""
    parser = argparse.ArgumentParser(description="Fetch the ZooKeeper server jars.")
    parser.add_argument("--lib", type=Path, default=None, help="default: the bkaudit cache")
    args = parser.parse_args(argv)
    lib = args.lib or zookeeper_lib()
    if is_complete(lib):
        return 0
    print(f"fetching ZooKeeper {ZOOKEEPER_VERSION} server jars into {lib}", file=sys.stderr)
    try:
        fetch_zookeeper(lib)
    except FetchError as exc:
        print(f"zookeeper_dist: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
