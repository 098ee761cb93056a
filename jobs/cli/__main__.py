"""``python -m jobs.cli``: the ``bkaudit`` command."""

import sys

from jobs.cli.commands import run

sys.exit(run())
