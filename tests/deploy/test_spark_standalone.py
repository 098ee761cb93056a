"""The README's deployment recipe, end to end, on a real Spark standalone cluster.

A Master and a Worker JVM from pip's pyspark; the wheel and ``bkaudit.zip`` built as the
README says; an executor virtualenv holding exactly the ``bkaudit[executor]`` extra (no
bkaudit, no pyspark: those come from ``--py-files`` and the Worker's Spark); and the two jobs
submitted with ``spark-submit`` from a directory outside the checkout against a sandbox
(ZooKeeper + Python bookies) that lost a bookie:

- ``jobs/audit.py`` with the executor venv installed on the node (``PYSPARK_PYTHON``);
- ``jobs/rereplicate.py`` with the same venv packed and shipped (``--archives``).

Then the findings and the actions are read back from the Delta tables (delta-rs, not Spark),
and every entry of every ledger is read from every replica and through bklib's reader.

The executor venv is cached under ``$BKAUDIT_CACHE`` by the hash of the dependency list and
the Python version; a machine without it builds it (pip, from the package index), and a build
that fails fails the test: there is no skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from bklib.meta.model import LedgerMetadata, Segment
from bklib.quorum import write_set
from bklib.states import Executor, Reason, RunStatus
from jobs.spark.jars import DELTA_PACKAGE
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS
from tests.audit_helpers import AuditCluster, audit_cluster
from tests.deploy.standalone import (
    REPO,
    StandaloneCluster,
    build_wheel,
    build_zip,
    executor_requirements,
    executor_venv,
    pack_venv,
    spark_env,
    spark_submit,
    standalone_cluster,
)
from tests.jvm import spark_jvm_options
from tests.repair_helpers import assert_fully_replicated

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

CACHE = Path(os.environ.get("BKAUDIT_CACHE", Path.home() / ".cache" / "bkaudit"))


def _stripe(md: LedgerMetadata, first: int, last: int, bookie: str) -> int:
    """How many entries of ``first..last`` the segment starting at ``first`` stores on
    ``bookie``: what a lost bookie leaves missing there."""
    ensemble = md.ensemble_for(first)
    idx = ensemble.index(bookie)
    return sum(
        1 for x in range(first, last + 1) if idx in write_set(x, md.ensemble_size, md.write_quorum)
    )


def _app_names(cluster: StandaloneCluster) -> list[str]:
    """Names of the applications the Master ran: completed ones, and those whose driver has
    exited but whose unregistration the Master has not handled yet (it is asynchronous)."""
    state = cluster.state()
    apps = [*state.get("completedapps", []), *state.get("activeapps", [])]
    return [str(a["name"]) for a in apps]


def _check(proc: subprocess.CompletedProcess[str], log: Path, cluster: StandaloneCluster) -> str:
    """The job's stdout, or a failure naming the exit code with the logs that explain it."""
    if proc.returncode != 0:
        pytest.fail(
            f"spark-submit exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr tail\n"
            + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
            + f"\n--- executors\n{cluster.executor_logs()}"
        )
    return proc.stdout


def _write_ledgers(c: AuditCluster, victim: str) -> list[LedgerMetadata]:
    """A few ledgers of several shapes; all but one name ``victim`` somewhere."""
    b0, b1, b2, b3 = c.bookie_ids
    assert victim == b2
    return [
        c.ledger([b0, b1, b2], 20, wq=2, aq=2),
        c.ledger([(0, [b0, b1, b3]), (6, [b0, b1, b2])], 14, wq=2, aq=2),
        c.ledger([b1, b2, b3], 9, wq=3, aq=2),
        c.ledger([b0, b1, b3], 5, wq=2, aq=2),  # healthy: no finding, no action
        c.ledger([b2, b3, b0], 6, wq=2, aq=2, closed=False),  # open: fenced and closed first
    ]


def test_readme_recipe_on_a_standalone_cluster(tmp_path: Path, zk_chroot: str) -> None:
    t0 = time.monotonic()
    # ---- the executor venv: exactly the executor extra, nothing of bkaudit or Spark ---------
    reqs = executor_requirements()
    assert reqs, "pyproject.toml has no executor extra"
    venv = executor_venv(CACHE, reqs)
    archive = pack_venv(venv)
    ex_python = venv / "bin/python"
    for absent in ("bklib", "jobs", "pyspark"):
        probe = subprocess.run(
            [str(ex_python), "-c", f"import {absent}"],
            cwd="/",
            env=spark_env(),
            capture_output=True,
            timeout=60,
        )
        assert probe.returncode != 0, f"the executor venv must not provide {absent}"
    t_venv = time.monotonic()

    # ---- packaging, as the README says ------------------------------------------------------
    dist = tmp_path / "dist"
    wheel = build_wheel(dist)
    bundle = build_zip(dist)
    # The wheel (for the driver host) and the zip (for the executors) ship the same modules.
    with zipfile.ZipFile(wheel) as w, zipfile.ZipFile(bundle) as z:
        wheel_py = {n for n in w.namelist() if n.endswith((".py", ".proto"))}
        zip_py = {n for n in z.namelist() if n.endswith((".py", ".proto"))}
        pycache = [n for n in z.namelist() if "__pycache__" in n]
    assert "jobs/spark/audit_job.py" in zip_py and "bklib/proto/formats.proto" in zip_py
    assert not pycache, pycache[:5]
    assert wheel_py == zip_py

    submit_dir = tmp_path / "submit"  # outside the checkout: nothing there to import
    submit_dir.mkdir()
    warehouse = str(tmp_path / "warehouse")
    common = [
        "--packages",
        DELTA_PACKAGE,
        "--py-files",
        str(bundle),
        "--conf",
        "spark.executor.memory=1g",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",  # quick-start executor JVMs (tests/jvm.py)
        f"spark.executor.extraJavaOptions={' '.join(spark_jvm_options())}",
    ]

    with (
        standalone_cluster(tmp_path / "spark") as spark_cluster,
        audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c,
    ):
        t_up = time.monotonic()
        victim = c.bookie_ids[2]
        mds = _write_ledgers(c, victim)
        c.sandbox.stop_bookie(victim)
        master = ["--master", spark_cluster.master_url]
        zk_args = ["--zk", c.zk, "--warehouse", warehouse]

        # ---- the audit: executor venv installed on the node (PYSPARK_PYTHON) ---------------
        env = spark_env(
            SPARK_CONF_DIR=str(REPO / "conf"),
            PYSPARK_DRIVER_PYTHON=sys.executable,
            PYSPARK_PYTHON=str(ex_python),
        )
        log = tmp_path / "audit.log"
        audit_argv = [*master, *common, str(REPO / "jobs/audit.py"), *zk_args]
        audit_argv += ["--check", "replicas", "--read-timeout", "3", "--connect-timeout", "3"]
        out = _check(spark_submit(submit_dir, audit_argv, env, log), log, spark_cluster)
        t_audit = time.monotonic()

        (run,) = delta.read_rows(warehouse, AUDIT_RUNS)
        assert run["run_id"] in out, out
        assert run["status"] == RunStatus.COMPLETED, run
        assert run["executor"] == Executor.SPARK
        found = delta.read_rows(warehouse, FRAGMENTS)
        assert {r["run_id"] for r in found} == {run["run_id"]}
        got = {(r["ledger_id"], r["segment_first_entry_id"]): r for r in found}
        want = {(md.ledger_id, s.first_entry_id) for md in mds for s in md.segments}
        want = {k for k in want if victim in _segment(mds, *k).ensemble}
        assert set(got) == want
        assert {(r["bookie_id"], r["reason"]) for r in found} == {(victim, Reason.BOOKIE_LOST)}
        for md in mds[:3]:  # closed ledgers: the victim's stripe is exactly what is missing
            for s in md.segments:
                if (md.ledger_id, s.first_entry_id) in got:
                    last = _segment_last(md, s.first_entry_id)
                    row = got[(md.ledger_id, s.first_entry_id)]
                    assert row["missing_entries"] == _stripe(md, s.first_entry_id, last, victim)
        assert "bkaudit-audit" in _app_names(spark_cluster)

        # ---- the repair: the same venv packed and shipped with --archives -------------------
        env = spark_env(SPARK_CONF_DIR=str(REPO / "conf"))
        log = tmp_path / "rereplicate.log"
        repair_argv = [
            *master,
            *common,
            "--archives",
            f"{archive}#venv",
            "--conf",
            "spark.pyspark.python=./venv/bin/python",
            "--conf",
            f"spark.pyspark.driver.python={sys.executable}",
            str(REPO / "jobs/rereplicate.py"),
            *zk_args,
            "--grace-period",
            "0s",
            "--read-timeout",
            "3",
            "--zk-session-timeout",
            "4s",
        ]
        out = _check(spark_submit(submit_dir, repair_argv, env, log), log, spark_cluster)
        t_repair = time.monotonic()
        assert "bkaudit-rereplicate" in _app_names(spark_cluster)
        # The archive was unpacked in the executor's directory: the tasks ran its python.
        assert list(spark_cluster.work_dir.glob("app-*/*/venv/bin/python")), (
            spark_cluster.executor_logs()
        )

        acts = delta.read_rows(warehouse, ACTIONS)
        copies = [a for a in acts if a["action"] == "COPY"]
        assert copies and {a["status"] for a in copies} == {"DONE"}, acts
        assert {a["old_bookie"] for a in copies} == {victim}
        assert victim not in {a["new_bookie"] for a in copies}
        assert {a["ledger_id"] for a in acts if a["action"] == "FENCE_AND_CLOSE"} == {
            mds[4].ledger_id
        }
        assert {a["ledger_id"] for a in acts if a["action"] == "METADATA_UPDATE"} == {
            lid for lid, _ in want
        }
        closed_copied = sum(
            a["entries_copied"] for a in copies if a["ledger_id"] != mds[4].ledger_id
        )
        closed_missing = sum(
            r["missing_entries"] for (lid, _), r in got.items() if lid != mds[4].ledger_id
        )
        assert closed_copied == closed_missing

        # ---- read back: every entry on every replica, and through the reader ----------------
        for md in mds:
            assert_fully_replicated(c.store, c.client, md.ledger_id, excluded=frozenset({victim}))
    t_end = time.monotonic()
    print(
        f"\ndeploy timings: venv {t_venv - t0:.0f}s, package+cluster {t_up - t_venv:.0f}s, "
        f"audit {t_audit - t_up:.0f}s, rereplicate {t_repair - t_audit:.0f}s, "
        f"read-back+stop {t_end - t_repair:.0f}s, total {t_end - t0:.0f}s"
    )


def _segment(mds: list[LedgerMetadata], ledger_id: int, first: int) -> Segment:
    """The segment of ledger ``ledger_id`` that starts at entry ``first``."""
    md = next(m for m in mds if m.ledger_id == ledger_id)
    return next(s for s in md.segments if s.first_entry_id == first)


def _segment_last(md: LedgerMetadata, first: int) -> int:
    """The last entry of the segment starting at ``first`` (closed ledgers)."""
    starts = [s.first_entry_id for s in md.segments]
    i = starts.index(first)
    return starts[i + 1] - 1 if i + 1 < len(starts) else md.last_entry_id
