"""How an error reaches an operator: one line, naming what failed; the traceback only at DEBUG
(``bkaudit -v``)."""

from __future__ import annotations

from bklib.errors import BKError
from bklib.version import extra_hint

__all__ = ["SPARK_EXTRA", "SPARK_MODULES", "one_line", "spark_missing"]

SPARK_EXTRA = extra_hint("spark")
"""What installs the Spark executor: pyspark and delta-spark are an extra, not a dependency."""

SPARK_MODULES = frozenset({"pyspark", "delta", "py4j"})
"""Top-level modules only the ``spark`` extra brings."""


def spark_missing(exc: BaseException) -> bool:
    """True when ``exc`` is the import of a module only the ``spark`` extra installs."""
    name = getattr(exc, "name", None) or ""
    return isinstance(exc, ModuleNotFoundError) and name.partition(".")[0] in SPARK_MODULES


def one_line(exc: BaseException) -> str:
    """``exc`` as one line. bkaudit's own errors already name the ledger, bookie or znode;
    anything else gets its type name, since a bare message may not say what broke. A missing
    Spark module names the extra that installs it."""
    if spark_missing(exc):
        module = str(getattr(exc, "name", "pyspark")).partition(".")[0]
        return f"{module} is not installed; Spark needs the spark extra: {SPARK_EXTRA}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, BKError) and text else f"{type(exc).__name__}: {text}"
