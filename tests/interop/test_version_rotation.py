"""The version rotation of ``make test``: besides the newest 4.17 (the rest of tests/interop),
one other BookKeeper line runs interop cells 1 and 3 each day, chosen by the day of the
year (``tests/interop/versions.py``; ``BKAUDIT_BK_ROTATION=4.18`` picks one). The full
matrix (cells 1, 3, 5, 6 and 9 on every line) is ``make interop-matrix``.

The cells run in a child pytest with ``BKAUDIT_BK_VERSION`` set, so they get their own
session fixtures (ZooKeeper, Java client, clusters) on that release.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from tests.interop import versions
from tests.interop.matrix import run_version

pytestmark = pytest.mark.interop


def test_rotation_takes_each_other_line_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(versions.ROTATION_ENV, raising=False)
    others = {v for v in versions.LINES.values() if v != versions.DEFAULT}
    start = datetime.date(2026, 1, 1)
    days = [start + datetime.timedelta(days=i) for i in range(len(others))]
    assert {versions.rotation_version(d) for d in days} == others
    monkeypatch.setenv(versions.ROTATION_ENV, "4.18")
    assert versions.rotation_version(start) == versions.LINES["4.18"]
    monkeypatch.setenv(versions.ROTATION_ENV, "5.0")
    with pytest.raises(versions.UnknownVersionError, match=r"5\.0"):
        versions.rotation_version(start)


@pytest.mark.timeout(1800)
def test_matrix_cells_on_the_rotation_version(tmp_path: Path) -> None:
    # The child pytest sets its own BKAUDIT_BK_VERSION and runs only ROTATION_CELLS (never
    # this test), so the rotation is the same whichever version this session runs.
    version = versions.rotation_version()
    # pytest's header names it too (tests/interop/conftest.py).
    print(f"interop rotation: BookKeeper {version} (set {versions.ROTATION_ENV} to choose)")
    result = run_version(version, tmp_path, versions.ROTATION_CELLS)
    assert result.ok, f"BookKeeper {version}:\n{result.table()}\n{result.output[-6000:]}"
    assert len(result.cases) >= len(versions.ROTATION_CELLS), result.table()
