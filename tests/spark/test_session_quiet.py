"""The Spark session is quiet unless ``--verbose``: Ivy's dependency-resolution report and the
JVM's start-up notices are held back, Spark's console progress bar is off (bkaudit draws its
own). With ``-v`` both come back, which also shows the quiet case hid something real.

Each case starts its own driver JVM in a subprocess with Ivy forced to resolve Delta's
package (the session normally skips Ivy once the jars are cached).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli_helpers import REPO

SCRIPT = """
import sys
from jobs.runtime.logs import setup_logging
setup_logging("INFO", verbose=sys.argv[1] == "-v")
from jobs.spark.jars import DELTA_PACKAGE
from jobs.spark.session import build_spark
spark = build_spark(
    "bkaudit-quiet-test",
    master="local[1]",
    overrides={"spark.jars.packages": DELTA_PACKAGE, "spark.jars": ""},
)
print("console progress", spark.conf.get("spark.ui.showConsoleProgress"))
print("rows", spark.range(100).repartition(2).count())
spark.stop()
"""

IVY_MARKERS = (":: resolving dependencies ::", "Ivy Default Cache", ":: retrieving ::")


def _session(flag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, flag],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.timeout(700)
def test_ivy_and_console_progress_hidden_by_default() -> None:
    proc = _session("-q")
    assert proc.returncode == 0, proc.stderr
    assert "rows 100" in proc.stdout
    assert "console progress false" in proc.stdout
    for marker in IVY_MARKERS:
        assert marker not in proc.stderr, proc.stderr
    assert "[Stage " not in proc.stderr


@pytest.mark.timeout(700)
def test_verbose_shows_ivy_and_spark_progress() -> None:
    proc = _session("-v")
    assert proc.returncode == 0, proc.stderr
    assert "console progress true" in proc.stdout
    assert ":: resolving dependencies ::" in proc.stderr, proc.stderr
