"""The ``bookkeeper_audit`` DAG under a real Airflow 2.10 (its own virtualenv, made by
scripts/install_airflow.sh): it imports cleanly, the task graph is as designed, the
spark-submit commands the provider's hook builds carry the params and parse with the jobs' own
argument parsers, and the branch and verification read a real Delta ``audit_runs`` table
written by Spark."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.states import RunStatus
from jobs.audit import add_audit_arguments
from jobs.rereplicate import add_repair_arguments
from jobs.spark import load
from jobs.tables.runs import RunRecord
from tests.audit_helpers import spark as spark  # the session fixture

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_VENV = Path(os.environ.get("AIRFLOW_VENV", REPO / ".venv-airflow"))
AIRFLOW_PY = AIRFLOW_VENV / "bin" / "python"
CHECKER = Path(__file__).with_name("dag_check.py")
SPARK_CONN = {"conn_type": "spark", "host": "local[2]", "extra": {"deploy-mode": "client"}}


def run_checker(tmp_path: Path, spec: dict[str, Any], **env: str) -> dict[str, Any]:
    """Run dag_check.py in the Airflow venv; returns its JSON."""
    if not AIRFLOW_PY.exists():
        # Never a skip: the suite needs every component (CI runs the script first).
        pytest.fail(f"{AIRFLOW_PY} missing: run scripts/install_airflow.sh")
    home = tmp_path / "airflow-home"
    home.mkdir(exist_ok=True)
    full_env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "airflow_dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SPARK_BKAUDIT": json.dumps(SPARK_CONN),
        "BKAUDIT_HOME": str(REPO),
        **env,
    }
    proc = subprocess.run(
        [str(AIRFLOW_PY), str(CHECKER), json.dumps(spec)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=tmp_path,
        timeout=240,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BKAUDIT-DAG-CHECK ")), None)
    assert proc.returncode == 0 and line, f"checker failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(line.split(" ", 1)[1])


DEFAULT_ENV = {"BKAUDIT_ZK": "zk1:2181,zk2:2181/pulsar", "BKAUDIT_WAREHOUSE": "/data/bkaudit"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The DAG as loaded with production-like env, commands rendered for a dry run."""
    spec = {
        "conf": {
            "check": "lost",
            "grace_period": "5m",
            "rate": "20MiB",
            "dry_run": True,
        },
        "ts_nodash": "20260301T120000",
        "xcom": {"audit_run_id": "airflow-20260301T120000-audit-t1"},
    }
    return run_checker(tmp_path_factory.mktemp("dag"), spec, **DEFAULT_ENV)


def test_dag_imports_without_errors_and_is_configured(rendered: dict[str, Any]) -> None:
    assert rendered["import_errors"] == {}
    assert rendered["dag_ids"] == ["bookkeeper_audit"]
    dag = rendered["dag"]
    assert dag["schedule"] == "@hourly"
    assert dag["catchup"] is False
    assert dag["max_active_runs"] == 1
    assert dag["tags"] == ["bkaudit", "bookkeeper", "repair"]
    assert dag["default_args"]["retries"] == "2"
    assert dag["default_args"]["retry_delay"] == str(timedelta(minutes=5))
    assert "check_findings" in dag["doc_md"] and "none_skipped" in dag["doc_md"]
    assert dag["params"] == {
        "zk": DEFAULT_ENV["BKAUDIT_ZK"],
        "warehouse": DEFAULT_ENV["BKAUDIT_WAREHOUSE"],
        "check": "replicas",
        "grace_period": "30s",
        "rate": "50MB",
        "dry_run": False,
    }


def test_task_graph(rendered: dict[str, Any]) -> None:
    tasks = rendered["tasks"]
    edges = {tid: (t["upstream"], t["downstream"]) for tid, t in tasks.items()}
    assert edges == {
        "audit": ([], ["check_findings"]),
        "check_findings": (["audit"], ["no_findings", "rereplicate"]),
        "rereplicate": (["check_findings"], ["verify_audit"]),
        "no_findings": (["check_findings"], []),
        "verify_audit": (["rereplicate"], ["verify_result"]),
        "verify_result": (["verify_audit"], []),
    }
    assert tasks["check_findings"]["operator"] == "_BranchPythonDecoratedOperator"
    assert tasks["verify_audit"]["trigger_rule"] == "none_skipped"
    assert {t for t, v in tasks.items() if v["is_spark_submit"]} == {
        "audit",
        "rereplicate",
        "verify_audit",
    }
    assert tasks["audit"]["retries"] == 2 and tasks["verify_result"]["retries"] == 0


def _app_args(cmd: list[str], app: str) -> list[str]:
    return cmd[cmd.index(app) + 1 :]


def test_rendered_spark_submit_commands_carry_the_params(rendered: dict[str, Any]) -> None:
    cmds = rendered["commands"]
    audit, repair, verify = cmds["audit"], cmds["rereplicate"], cmds["verify_audit"]
    for c, job in ((audit, "audit.py"), (repair, "rereplicate.py"), (verify, "audit.py")):
        assert c["application"] == str(REPO / "jobs" / job)
        assert Path(c["application"]).is_file()
        assert c["command"][:3] == ["spark-submit", "--master", "local[2]"]
        assert "--deploy-mode" in c["command"]
        assert "spark.ui.showConsoleProgress=false" in c["command"]
        assert c["env_vars"] == {"SPARK_CONF_DIR": str(REPO / "conf")}

    audit_args = _app_args(audit["command"], audit["application"])
    assert audit_args == [
        "--zk",
        DEFAULT_ENV["BKAUDIT_ZK"],
        "--warehouse",
        DEFAULT_ENV["BKAUDIT_WAREHOUSE"],
        "--check",
        "lost",
        "--run-id",
        "airflow-20260301T120000-audit-t1",
    ]
    # The jobs' own parsers accept exactly what Airflow will pass.
    a = add_audit_arguments(argparse.ArgumentParser()).parse_args(audit_args)
    assert (a.zk, a.warehouse, a.check) == (DEFAULT_ENV["BKAUDIT_ZK"], "/data/bkaudit", "lost")
    v = add_audit_arguments(argparse.ArgumentParser()).parse_args(
        _app_args(verify["command"], verify["application"])
    )
    assert v.run_id == "airflow-20260301T120000-verify-t1"

    repair_args = _app_args(repair["command"], repair["application"])
    r = add_repair_arguments(argparse.ArgumentParser()).parse_args(repair_args)
    assert r.run_id == "airflow-20260301T120000-audit-t1"  # the audit the branch read
    assert (r.grace_period, r.rate, r.dry_run) == (300.0, 20 * 1024**2, True)
    assert (r.zk, r.warehouse) == (DEFAULT_ENV["BKAUDIT_ZK"], DEFAULT_ENV["BKAUDIT_WAREHOUSE"])


def test_not_a_dry_run_drops_the_flag(tmp_path: Path) -> None:
    out = run_checker(tmp_path, {"conf": {"dry_run": False}}, **DEFAULT_ENV)
    repair = out["commands"]["rereplicate"]
    args = _app_args(repair["command"], repair["application"])
    assert "--dry-run" not in args and "" not in args
    assert args[args.index("--grace-period") + 1] == "30s"


def test_missing_target_cluster_is_an_import_error(tmp_path: Path) -> None:
    out = run_checker(tmp_path, {}, BKAUDIT_ZK="", BKAUDIT_WAREHOUSE="/w")
    assert out["dag_ids"] == []
    (error,) = out["import_errors"].values()
    assert "zk" in error


def test_branch_and_verification_read_real_delta_audit_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse = str(tmp_path / "warehouse")
    t0 = datetime(2026, 3, 1, 12, tzinfo=timezone.utc)

    def record(run_id: str, status: str, minutes: int, **counts: int) -> None:
        started = t0 + timedelta(minutes=minutes)
        run = RunRecord(run_id, started, "zk:2181", "replicas", status)
        run.finished_at = started + timedelta(seconds=30)
        run.counts = dict(counts)
        run.error = "boom" if status == RunStatus.FAILED else None
        load.write_run_record(spark, warehouse, run)

    # ts A: first try failed, the retry found 3 ledgers; the verify still finds 1.
    record("airflow-A-audit-t1", RunStatus.FAILED, 0)
    record("airflow-A-audit-t2", RunStatus.COMPLETED, 1, underreplicated_ledgers=3, fragments=4)
    record("airflow-A-verify-t1", RunStatus.COMPLETED, 5, underreplicated_ledgers=1, fragments=1)
    # ts B: clean audit, clean verify. ts C: the audit failed. ts D: no run at all.
    record("airflow-B-audit-t1", RunStatus.COMPLETED, 10, fragments=0)
    record("airflow-B-verify-t1", RunStatus.COMPLETED, 11, fragments=0)
    record("airflow-C-audit-t1", RunStatus.FAILED, 20)
    # ts E: the audit could not read everything and found nothing: not clean. ts F: it could
    # not read everything but found fragments: those are repaired; its verify read less
    # than everything and found nothing, so it does not pass.
    record("airflow-E-audit-t1", RunStatus.COMPLETED_WITH_ERRORS, 40, ledgers_unaccounted=2)
    record(
        "airflow-F-audit-t1", RunStatus.COMPLETED_WITH_ERRORS, 50, fragments=2, metadata_errors=1
    )
    record(
        "airflow-F-verify-t1", RunStatus.COMPLETED_WITH_ERRORS, 55, fragments=0, metadata_errors=1
    )
    # Another writer's run that only looks similar must not be picked up.
    record("manual-A-audit-t1", RunStatus.COMPLETED, 30, underreplicated_ledgers=9)

    out = run_checker(
        tmp_path,
        {
            "conf": {"warehouse": warehouse},
            "branch": ["A", "B", "C", "D", "E", "F"],
            "verify": [["A", False], ["A", True], ["B", False], ["F", False]],
        },
        **DEFAULT_ENV,
    )
    br = out["branch"]
    assert br["A"] == {
        "branch": "rereplicate",
        "pushed": {"audit_run_id": "airflow-A-audit-t2"},
    }
    assert br["B"] == {"branch": "no_findings", "pushed": {"audit_run_id": "airflow-B-audit-t1"}}
    assert "airflow-C-audit-t1 is FAILED: boom" in br["C"]["error"]
    assert "no audit run with id airflow-D-audit-t*" in br["D"]["error"]
    assert "airflow-E-audit-t1 is COMPLETED_WITH_ERRORS" in br["E"]["error"]
    assert "2 ledgers unaccounted for" in br["E"]["error"] and "not clean" in br["E"]["error"]
    assert br["F"] == {"branch": "rereplicate", "pushed": {"audit_run_id": "airflow-F-audit-t1"}}
    (a_real, a_dry, b, f) = out["verify"]
    assert not f["passed"] and "COMPLETED_WITH_ERRORS: 1 unreadable znodes" in f["summary"]
    assert (a_real["passed"], a_real["error"]) == (False, "AirflowFailException")
    assert "1 under-replicated ledgers" in a_real["summary"]
    assert a_dry["passed"] and "dry run" in a_dry["summary"]
    assert b["passed"] and "0 under-replicated ledgers" in b["summary"]


def test_support_helpers_are_pure() -> None:
    sys.path.insert(0, str(REPO / "airflow_dags"))
    try:
        import bkaudit_support as s
    finally:
        sys.path.remove(str(REPO / "airflow_dags"))
    assert s.drop_empty(["--zk", "z", "", None, "--dry-run"]) == ["--zk", "z", "--dry-run"]
    assert s.run_id_prefix("20260101T000000", "audit") == "airflow-20260101T000000-audit-t"
    run = {"run_id": "r", "status": "COMPLETED", "counts": {"fragments": 0}}
    assert s.choose_branch(run, "r") == "no_findings"
    with pytest.raises(RuntimeError, match="no audit run"):
        s.choose_branch(None, "x-")
