"""Did a metadata scan read every ledger it should have? Pure arithmetic, no I/O.

Before a scan, the driver stats each directory of the ledger tree (child count and child
version, :class:`~bklib.meta.store.LeafDir`). After it, the driver reads the child versions
again. A directory whose child version did not move had no ledger created or deleted while the
scan ran, so the scan must have found exactly as many ledgers there as the stat announced. A
directory that changed explains any difference in it; nothing else does. A difference nobody
can explain means the scan lost ledgers somewhere (a swallowed error, a lost task), and the run
is not COMPLETED (docs/reliability.md, "Counting what was read").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bklib.meta.store import LeafDir
from bklib.states import CountKey

__all__ = ["ScanAccount", "account_scan", "directory_of", "scanned_per_directory"]


def directory_of(znode_path: str) -> str:
    """The directory holding a ledger znode (its leaf directory, or the root when flat)."""
    return znode_path.rsplit("/", 1)[0] or "/"


def scanned_per_directory(znode_paths: Iterable[str | None]) -> Counter[str]:
    """How many scanned ledgers (readable or not) each directory held."""
    return Counter(directory_of(p) for p in znode_paths if p)


@dataclass(frozen=True)
class ScanAccount:
    """Ledgers announced by the directory stats against ledgers scanned."""

    expected: int
    scanned: int
    changed_dirs: tuple[str, ...]
    """Directories with ledgers created or deleted during the scan: their counts may differ."""
    unaccounted: int
    """Ledgers missing from (or extra in) unchanged directories: no recorded reason."""
    unaccounted_dirs: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """True when every difference between announced and scanned has a reason."""
        return self.unaccounted == 0

    def counts(self) -> dict[str, int]:
        """The ``audit_runs.counts`` entries this account records."""
        return {
            CountKey.LEDGERS_EXPECTED: self.expected,
            CountKey.LEDGER_DIRS_CHANGED: len(self.changed_dirs),
            CountKey.LEDGERS_UNACCOUNTED: self.unaccounted,
        }

    def describe(self) -> str:
        """One line for the log."""
        text = (
            f"{self.scanned} of {self.expected} announced ledgers scanned, "
            f"{len(self.changed_dirs)} directories changed during the scan"
        )
        if self.unaccounted:
            shown = ", ".join(self.unaccounted_dirs[:5])
            more = len(self.unaccounted_dirs) - 5
            text += (
                f"; {self.unaccounted} ledgers unaccounted for in unchanged directories "
                f"{shown}{f' and {more} more' if more > 0 else ''}"
            )
        return text


def account_scan(
    planned: Sequence[LeafDir],
    versions_after: Mapping[str, int | None],
    scanned: Mapping[str, int],
) -> ScanAccount:
    """Compare the planned directories with what the scan found in each.

    ``versions_after`` holds each directory's child version read after the scan (None when
    it was deleted); ``scanned`` the ledgers the scan produced per directory. A directory
    planned without a version (-1) counts as changed: nothing can be proved about it.
    """
    changed: list[str] = []
    bad: list[str] = []
    unaccounted = 0
    planned_paths = {d.path for d in planned}
    for d in planned:
        found = scanned.get(d.path, 0)
        after = versions_after.get(d.path)
        if d.cversion < 0 or after is None or after != d.cversion:
            changed.append(d.path)
        elif found != d.count:
            bad.append(d.path)
            unaccounted += abs(found - d.count)
    # Ledgers from a directory the plan never named cannot come from this scan.
    for path, n in scanned.items():
        if path not in planned_paths and n:
            bad.append(path)
            unaccounted += n
    return ScanAccount(
        expected=sum(d.count for d in planned),
        scanned=sum(scanned.values()),
        changed_dirs=tuple(changed),
        unaccounted=unaccounted,
        unaccounted_dirs=tuple(bad),
    )
