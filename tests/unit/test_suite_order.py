"""The suite's heavy-first order (tests/conftest.py) names files that exist: a renamed file
would otherwise drop silently to the end of the run."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import HEAVY_FIRST

REPO = Path(__file__).resolve().parents[2]


def test_every_heavy_file_exists_once() -> None:
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
    assert [p for p in HEAVY_FIRST if not (REPO / p).is_file()] == []
