"""``python -m jobs.cli``: the ``bkaudit`` command."""

import sys

from jobs.cli.main import run

sys.exit(run())
