"""Which Apache BookKeeper release the interop tests run, and the version matrix.

``BKAUDIT_BK_VERSION`` picks the release (default :data:`DEFAULT`, the newest 4.17 on Maven
Central); ``scripts/install_bookkeeper.sh`` installs any of them under
``$BKAUDIT_CACHE/bookkeeper/<version>``. :data:`LINES` holds the newest installable patch of each
line we support. ``make test`` runs :data:`DEFAULT` always and, in rotation, one other line's
:data:`ROTATION_CELLS` (:func:`rotation_version`); ``make interop-matrix`` runs
:data:`MATRIX_CELLS` on every line.
"""

from __future__ import annotations

import datetime
import os

# The newest patch of each line that resolves from Maven Central (checked 2026-11-23 against
# bookkeeper-server's maven-metadata.xml). 4.18.2 is listed there, but only its
# bookkeeper-server and bookkeeper-common jars are published: the parent pom
# org.apache.bookkeeper:bookkeeper:4.18.2 and bookkeeper-proto 4.18.2 are missing, so Maven
# cannot resolve it; 4.18.0 is the newest complete 4.18 release.
LINES: dict[str, str] = {"4.16": "4.16.6", "4.17": "4.17.3", "4.18": "4.18.0"}
DEFAULT = LINES["4.17"]
ENV = "BKAUDIT_BK_VERSION"
# Overrides the rotation of `make test`: a version, or a line such as 4.18.
ROTATION_ENV = "BKAUDIT_BK_ROTATION"

# Interop cells 1 and 3 (docs/interop.md): what `make test` runs on the rotation line. Cells 5
# and 6 (Spark audits, Java AutoRecovery) cost minutes per line and run in the full matrix.
# Paths are relative to the repository root.
ROTATION_CELLS: tuple[str, ...] = (
    "tests/interop/test_clients.py::test_python_writes_java_bookies_java_reads",
    "tests/interop/test_clients.py::test_python_open_ledger_recovered_by_java",
    "tests/interop/test_clients.py::test_java_writes_python_bookies",
    "tests/interop/test_clients.py::test_java_recovery_on_python_bookies",
)
# The matrix (`make interop-matrix`) runs cells 1, 3, 5, 6 and 9 (the format-v1 repair) on
# every line.
MATRIX_CELLS: tuple[str, ...] = (
    *ROTATION_CELLS,
    "tests/interop/test_audit_repair.py",
    "tests/interop/test_underreplication.py",
    "tests/interop/test_metadata_v1.py",
)


class UnknownVersionError(ValueError):
    """A BookKeeper version or line we do not know how to install."""


def resolve(name: str) -> str:
    """A full version for ``name``: a line (``4.18``) maps to its newest patch."""
    if name in LINES:
        return LINES[name]
    parts = name.split(".")
    if len(parts) == 3 and all(p.isdigit() for p in parts) and ".".join(parts[:2]) in LINES:
        return name
    raise UnknownVersionError(
        f"unknown BookKeeper version {name!r}: use one of {', '.join(LINES.values())}"
    )


def selected() -> str:
    """The release this test process runs: ``$BKAUDIT_BK_VERSION`` or :data:`DEFAULT`."""
    return resolve(os.environ.get(ENV) or DEFAULT)


def rotation_version(today: datetime.date | None = None) -> str:
    """The extra line ``make test`` runs: ``$BKAUDIT_BK_ROTATION`` if set, otherwise the lines
    other than the default taken in turn by the day of the year."""
    override = os.environ.get(ROTATION_ENV)
    if override:
        return resolve(override)
    others = [v for v in LINES.values() if v != DEFAULT]
    day = (today or datetime.date.today()).timetuple().tm_yday
    return others[day % len(others)]
