"""``spark-submit jobs/audit.py ...``: the audit on Spark, with ``bkaudit audit``'s flags.

The command itself is :mod:`jobs.commands.audit`; this file stays where spark-submit, the
Airflow DAG and the docs find it.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # `spark-submit jobs/audit.py`: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.commands.audit import main

if __name__ == "__main__":
    sys.exit(main())
