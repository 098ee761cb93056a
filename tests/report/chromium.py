"""Headless Chromium for the report's screenshot tests (``scripts/install_chromium.sh``
installs Debian's; ``BKAUDIT_CHROMIUM`` names another)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

CHROMIUM = os.environ.get("BKAUDIT_CHROMIUM", "/usr/bin/chromium")


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with ``args`` (a screenshot, a DOM dump); fails if it fails."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: run scripts/install_chromium.sh"
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
