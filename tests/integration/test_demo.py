"""``bkaudit demo`` end to end, through the real command: it tells its story (tables and a few
lines per step) instead of a log per ledger, Ivy's report or Spark's progress bars."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.cli_helpers import REPO

pytestmark = pytest.mark.integration

MAX_LINES = 90
"""Non-blank output lines, stdout and stderr together. ``make demo`` printed about 1,000 before
library logs moved to DEBUG (one line per ledger and per failed read of the lost bookie) and
the listing was cut to its first ledgers; it prints about 70 now."""

OUTCOME = "findings reported, repaired, re-audit clean, every entry read"


@pytest.mark.timeout(1500)
def test_demo_output_is_the_story_not_the_logs() -> None:
    # Periodic progress lines come every few seconds, so their number depends on the
    # machine's speed, not on what the demo prints on purpose: off for the count.
    env = dict(os.environ, BKAUDIT_PROGRESS="off")
    env.pop("BKAUDIT_LOG_FORMAT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "demo", "--ledgers", "60"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert OUTCOME in proc.stdout
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) <= MAX_LINES, "\n".join(lines)
    steps = re.findall(r"^== \[(\d)/9\]", proc.stdout, flags=re.M)
    assert steps == [str(n) for n in range(1, 10)]
    # The tables the demo means to show.
    assert "E/WQ/AQ  state" in proc.stdout and "MissingReplica" in proc.stdout
    for noise in ("bklib.client", "[Stage ", ":: resolving dependencies", "Traceback"):
        assert noise not in out, noise
