"""Keep pandas out of a ``bkaudit`` process.

pyarrow imports pandas, about 0.2 s, the first time it builds an array from Python values or
loads ``pyarrow.dataset``, only to ask whether a value is a pandas object. The local
executor and the table readers never use pandas, so the ``bkaudit`` command's process
declines it and pyarrow takes its path for a machine without pandas. The cost showed in every
command that reads or writes a Delta table, and in the audit's own span (docs/benchmarks.md).

Spark is the exception: its ``mapInArrow`` is a pandas UDF underneath and asks for pandas in
the driver, so :func:`jobs.spark.session.build_spark` allows it again before the session
starts. Code that imports ``jobs`` as a library (a notebook, the Airflow DAG, the tests) and
the ``spark-submit`` scripts keep pandas throughout.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["allow_pandas", "decline_pandas"]


class _DeclinePandas(importlib.abc.MetaPathFinder):
    """A meta-path finder in front of the others: pandas "is not installed"."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] == "pandas":
            # ModuleNotFoundError is what pyarrow and pyspark catch when pandas is absent.
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def decline_pandas() -> bool:
    """Make ``import pandas`` fail in this process from now on, as if it were not installed;
    returns whether it does. A process that already imported pandas keeps it (False)."""
    if any(isinstance(f, _DeclinePandas) for f in sys.meta_path):
        return True
    if "pandas" in sys.modules:
        return False
    sys.meta_path.insert(0, _DeclinePandas())
    return True


def allow_pandas() -> None:
    """Undo :func:`decline_pandas`: ``import pandas`` works again in this process.

    pyarrow itself does not look again: once it has converted a value without pandas, it keeps
    treating pandas objects as unknown (a ``pandas.Timestamp`` loses its nanoseconds, ``NaT``
    is refused). Spark's driver code here hands pyarrow no pandas objects (its DataFrames are
    built from rows and RDDs, and ``mapInArrow`` runs in worker processes of their own); keep
    it that way, or build the session before the first Arrow conversion."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DeclinePandas)]
