"""``spark-submit jobs/rereplicate.py [recover|decommission] ...``: the repair commands on
Spark, with ``bkaudit rereplicate``'s (or ``recover``'s, ``decommission``'s) flags.

The commands themselves are :mod:`jobs.commands.repair`; this file stays where spark-submit,
the Airflow DAG and the docs find it.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # `spark-submit jobs/rereplicate.py`: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.commands.repair import main

if __name__ == "__main__":
    sys.exit(main())
