"""Pinned jars from a Maven repository: fetched once, checked against their SHA-256, cached.

What bkaudit runs on a JVM without a build tool (the ZooKeeper server of the sandbox,
:mod:`bklib.testing.zookeeper_dist`; the Delta Lake jars of a Spark image,
:mod:`jobs.spark.jars`) is a list of :class:`Artifact`, each with the SHA-256 of the file
Maven Central serves. :func:`fetch_artifacts` fills a directory with them, complete or not at
all: the jars go to a temporary directory that replaces the old one only when every checksum
matched, and a stamp naming the list marks it complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MAVEN_CENTRAL",
    "REPOSITORY_ENV",
    "Artifact",
    "FetchError",
    "Fetched",
    "cache_dir",
    "fetch_artifacts",
    "is_complete",
]

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
REPOSITORY_ENV = "BKAUDIT_MAVEN_REPOSITORY"
"""A Maven repository to fetch from instead of Maven Central (a mirror or proxy)."""

_CHUNK = 256 * 1024


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


Fetched = Callable[[Artifact], None]
"""Called after each jar is downloaded and verified (a progress bar counts them)."""


class FetchError(RuntimeError):
    """A jar could not be fetched, or did not have its pinned checksum; names the URL."""


def cache_dir() -> Path:
    """bkaudit's download cache: ``$BKAUDIT_CACHE``, else ``~/.cache/bkaudit``."""
    return Path(os.environ.get("BKAUDIT_CACHE", Path.home() / ".cache" / "bkaudit"))


def _stamp(artifacts: Sequence[Artifact]) -> str:
    # Names the list: a directory filled from another list is fetched again.
    names = "\n".join(a.filename + a.sha256 for a in artifacts)
    return ".complete-" + hashlib.sha256(names.encode()).hexdigest()[:12]


def is_complete(dest: Path, artifacts: Sequence[Artifact]) -> bool:
    """True when ``dest`` holds every jar of ``artifacts``, fetched and verified."""
    return (dest / _stamp(artifacts)).is_file()


def fetch_artifacts(
    artifacts: Sequence[Artifact],
    dest: Path,
    *,
    repository: str | None = None,
    fetched: Fetched | None = None,
    timeout: float = 60.0,
) -> Path:
    """Make ``dest`` hold exactly ``artifacts`` and return it; nothing is fetched when it
    already does. The repository is ``repository``, else ``$BKAUDIT_MAVEN_REPOSITORY``, else
    Maven Central. Raises :class:`FetchError` naming the URL when a download fails or a
    checksum differs; ``dest`` is then left as it was."""
    if is_complete(dest, artifacts):
        return dest
    repo = repository or os.environ.get(REPOSITORY_ENV) or MAVEN_CENTRAL
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for art in artifacts:
            _download(art, repo, staging / art.filename, timeout)
            if fetched is not None:
                fetched(art)
        (staging / _stamp(artifacts)).touch()
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the jars from other users' JVMs
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


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
