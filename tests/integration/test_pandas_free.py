"""A ``bkaudit`` process never loads pandas (:mod:`jobs.runtime.pandas_free`), and its Delta tables
still read and write as before. Each case runs in a subprocess, since declining pandas is for
the rest of a process's life. That ``build_spark`` allows pandas again is exercised by every
test running Spark through ``python -m jobs.cli`` (test_secret_scan, test_demo): without it,
``mapInArrow`` stops them with "Pandas >= 2.0.0 must be installed"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli_helpers import REPO
from tests.integration.test_executor_cli import _metadata_only_cluster

# Reports at exit whether pandas got imported, then runs the real `python -m jobs.cli`.
AS_BKAUDIT = (
    "import atexit, runpy, sys;"
    "atexit.register(lambda: print('pandas loaded:', 'pandas' in sys.modules, file=sys.stderr));"
    "sys.argv[0] = 'bkaudit';"
    "runpy.run_module('jobs.cli', run_name='__main__', alter_sys=True)"
)


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=180
    )


def _prints_ok(code: str) -> None:
    """Run ``code`` in a fresh interpreter; it must exit 0 having printed just "ok"."""
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok", proc.stdout


def test_declined_pandas_is_not_installed_and_arrow_still_converts() -> None:
    code = """
import datetime, sys
from jobs.runtime.pandas_free import decline_pandas
assert decline_pandas() and decline_pandas()
assert sum(type(f).__name__ == "_DeclinePandas" for f in sys.meta_path) == 1
try:
    import pandas
except ModuleNotFoundError as exc:
    assert exc.name == "pandas", exc.name
else:
    raise SystemExit("pandas imported")
import pyarrow as pa
import pyarrow.dataset
t = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.timezone.utc)
arr = pa.array([t, None], pa.timestamp("us", tz="UTC"))
assert arr.to_pylist() == [t, None], arr.to_pylist()
rows = [{"a": 1, "m": [("k", 2)]}]
schema = pa.schema([("a", pa.int64()), ("m", pa.map_(pa.string(), pa.int64()))])
assert pa.Table.from_pylist(rows, schema=schema).to_pylist() == rows
assert "pandas" not in sys.modules
print("ok")
"""
    _prints_ok(code)


def test_spark_can_import_pandas_again_after_arrow_ran_without_it() -> None:
    code = """
from jobs.runtime.pandas_free import allow_pandas, decline_pandas
decline_pandas()
import pyarrow as pa
pa.array([1])  # pyarrow has now settled on "no pandas"
from pyspark.sql.pandas.utils import require_minimum_pandas_version
try:
    require_minimum_pandas_version()  # what mapInArrow asks in the driver
except ImportError:
    pass
else:
    raise SystemExit("pandas still importable after decline_pandas()")
allow_pandas()
require_minimum_pandas_version()
import pandas
print("ok")
"""
    _prints_ok(code)


def test_a_process_that_already_has_pandas_keeps_it() -> None:
    code = """
import sys
import pandas
from jobs.runtime.pandas_free import decline_pandas
assert decline_pandas() is False
import pandas.api.types
assert not any(type(f).__name__ == "_DeclinePandas" for f in sys.meta_path)
print("ok")
"""
    _prints_ok(code)


def test_bkaudit_writes_and_reads_its_tables_without_pandas(zk_chroot: str, tmp_path: Path) -> None:
    _metadata_only_cluster(zk_chroot, 5)
    wh = str(tmp_path / "wh")
    for _ in range(2):  # the second run reads the first's findings to carry them forward
        proc = _python(
            "-c", AS_BKAUDIT, "audit", "--zk", zk_chroot, "--warehouse", wh,
            "--check", "lost", "--executor", "local",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "COMPLETED" in proc.stdout and "5 ledgers" in proc.stdout, proc.stdout
        assert "pandas loaded: False" in proc.stderr, proc.stderr

    out = tmp_path / "report.html"
    proc = _python("-c", AS_BKAUDIT, "report", "--warehouse", wh, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "pandas loaded: False" in proc.stderr, proc.stderr
    assert out.read_text().count("10.255.0.1:3181") >= 1

    proc = _python("-c", AS_BKAUDIT, "listunderreplicated", "--warehouse", wh)
    assert proc.returncode == 1, proc.stderr  # findings exist
    assert "pandas loaded: False" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    # Every ledger lost all three of its bookies, found by the first run ("since" its time).
    listed = [line for line in proc.stdout.splitlines() if line.strip().isdigit()]
    assert len(listed) == 5, proc.stdout
    assert "5 under-replicated ledgers, 15 fragments" in proc.stdout, proc.stdout
    assert proc.stdout.count(" since 20") == 15, proc.stdout
