"""The BookKeeper version matrix: the interop cells of :data:`versions.MATRIX_CELLS` against
each release line, one pytest process per version (``BKAUDIT_BK_VERSION`` set).

``make interop-matrix`` runs ``python -m tests.interop.matrix`` (every line) and prints one
Markdown table per version, the tables of docs/interop.md. ``--versions 4.18`` picks lines.
The exit status is 0 only when every version passed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.interop import harness, versions


@dataclass
class CaseResult:
    """One test of one version's run."""

    name: str
    outcome: str  # passed, failed, error, skipped
    seconds: float


@dataclass
class VersionResult:
    """One pytest run of the matrix cells against one BookKeeper version."""

    version: str
    returncode: int
    seconds: float
    cases: list[CaseResult] = field(default_factory=list)
    output: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.returncode == 0
            and bool(self.cases)
            and all(c.outcome == "passed" for c in self.cases)
        )

    def table(self) -> str:
        """The Markdown table of this run."""
        lines = [
            f"BookKeeper **{self.version}**: "
            f"{sum(c.outcome == 'passed' for c in self.cases)}/{len(self.cases)} passed "
            f"in {self.seconds:.0f} s",
            "",
            "| test | result | seconds |",
            "|---|---|---|",
        ]
        lines += [f"| `{c.name}` | {c.outcome} | {c.seconds:.1f} |" for c in self.cases]
        return "\n".join(lines)


def _cases(junit: Path) -> list[CaseResult]:
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = (case.get("classname") or "").rsplit(".", 1)[-1]
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = "failed" if tag == "failure" else tag
        out.append(CaseResult(f"{module}::{case.get('name')}", outcome, float(case.get("time", 0))))
    return out


def run_version(
    version: str, workdir: Path, cells: Sequence[str] = versions.MATRIX_CELLS
) -> VersionResult:
    """Install ``version`` (a no-op when cached) and run ``cells`` against it in a fresh pytest
    process; its output goes to ``workdir/pytest-<version>.log``."""
    harness.install(version)  # outside the timed run: a first install downloads jars
    workdir.mkdir(parents=True, exist_ok=True)
    junit = workdir / f"junit-{version}.xml"
    junit.unlink(missing_ok=True)
    started = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            *cells,
        ],
        cwd=harness.REPO,
        env={**os.environ, versions.ENV: version, "PYTHONPATH": str(harness.REPO)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    seconds = time.monotonic() - started
    output = res.stdout + res.stderr
    (workdir / f"pytest-{version}.log").write_text(output)
    cases = _cases(junit) if junit.exists() else []
    return VersionResult(version, res.returncode, seconds, cases, output)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.matrix", description=__doc__)
    parser.add_argument(
        "--versions",
        default=",".join(versions.LINES),
        help="comma-separated lines or versions (default: every line, newest patch of each)",
    )
    parser.add_argument(
        "--workdir", default="build/interop-matrix", help="logs and JUnit files go here"
    )
    args = parser.parse_args(argv)
    todo = [versions.resolve(v.strip()) for v in args.versions.split(",") if v.strip()]
    results = []
    for version in todo:
        print(f"== BookKeeper {version}: {len(versions.MATRIX_CELLS)} cells", flush=True)
        result = run_version(version, Path(args.workdir))
        results.append(result)
        print(result.table() + "\n", flush=True)
        if not result.ok:
            print(result.output[-4000:], flush=True)
    for r in results:
        print(f"{r.version}: {'PASS' if r.ok else 'FAIL'} ({r.seconds:.0f} s)")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
