"""No product module is over 800 lines.

A module that long holds more than one job; split it by job (docs: one job per module, a name
that says what it holds) rather than let it grow. protoc's generated modules
(``bklib/proto/*_pb2.py``, ``make proto``) are not ours to split and are left out.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("bklib", "jobs", "airflow_dags")
MAX_LINES = 800


def _generated(path: Path) -> bool:
    return path.parts[:2] == ("bklib", "proto") and path.name.endswith("_pb2.py")


def oversized(root: Path = REPO, limit: int = MAX_LINES) -> list[str]:
    """``path: N lines`` for every ``.py`` file under the product packages of ``root`` longer
    than ``limit`` lines, generated protobuf modules excepted."""
    out: list[str] = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if _generated(rel):
                continue
            with path.open("rb") as f:
                n = sum(1 for _ in f)
            if n > limit:
                out.append(f"{rel}: {n} lines")
    return out


def test_the_scan_names_an_oversized_file(tmp_path: Path) -> None:
    """The scan sees what it must (else the test below would pass vacuously)."""
    (tmp_path / "jobs" / "sub").mkdir(parents=True)
    (tmp_path / "jobs" / "sub" / "big.py").write_text("x = 1\n" * 801)
    (tmp_path / "jobs" / "sub" / "fits.py").write_text("x = 1\n" * 800)
    (tmp_path / "bklib" / "proto").mkdir(parents=True)
    (tmp_path / "bklib" / "proto" / "huge_pb2.py").write_text("x = 1\n" * 5000)
    (tmp_path / "bklib" / "proto" / "framing.py").write_text("x = 1\n" * 900)
    assert oversized(tmp_path) == [
        "bklib/proto/framing.py: 900 lines",
        "jobs/sub/big.py: 801 lines",
    ]


def test_no_product_module_is_over_800_lines() -> None:
    too_long = oversized()
    assert not too_long, f"over {MAX_LINES} lines, split by job: " + "; ".join(too_long)
