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
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bklib.maven import Artifact, Fetched, FetchError, cache_dir, fetch_artifacts
from bklib.maven import is_complete as _is_complete

__all__ = [
    "ZOOKEEPER_SERVER",
    "ZOOKEEPER_VERSION",
    "fetch_zookeeper",
    "is_complete",
    "zookeeper_lib",
]

ZOOKEEPER_VERSION = "3.9.3"


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


def zookeeper_lib() -> Path:
    """Where the ZooKeeper server jars are: ``$BKAUDIT_ZOOKEEPER_LIB``, else the cache's."""
    return Path(os.environ.get("BKAUDIT_ZOOKEEPER_LIB", cache_dir() / "zookeeper" / "lib"))


def is_complete(lib: Path) -> bool:
    """True when ``lib`` holds every pinned jar, fetched and verified."""
    return _is_complete(lib, ZOOKEEPER_SERVER)


def fetch_zookeeper(
    lib: Path | None = None,
    *,
    repository: str | None = None,
    fetched: Fetched | None = None,
    timeout: float = 60.0,
) -> Path:
    """Make ``lib`` (default :func:`zookeeper_lib`) hold the pinned ZooKeeper server jars and
    return it (:func:`bklib.maven.fetch_artifacts`: nothing fetched when it already does;
    :class:`~bklib.maven.FetchError` naming the URL, ``lib`` untouched, when one fails)."""
    lib = zookeeper_lib() if lib is None else lib
    return fetch_artifacts(
        ZOOKEEPER_SERVER, lib, repository=repository, fetched=fetched, timeout=timeout
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
