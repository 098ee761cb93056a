"""The ``bookkeeper_audit`` DAG under a real Airflow in its own virtualenv, made by
scripts/install_airflow.sh: Airflow 3 in .venv-airflow (``make test``), or Airflow 2.10 with
``AIRFLOW_VENV=.venv-airflow2 BKAUDIT_AIRFLOW_MAJOR=2`` (``make airflow2-test``). It imports
cleanly, the task graph is as designed, the spark-submit commands the provider's hook builds
carry the params, parse with the jobs' own argument parsers and hold no secret, and the branch
and verification read a real Delta ``audit_runs`` table created by Spark."""

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

from bklib.audit.checks import replication_names
from bklib.audit.checks.render import dag_description
from bklib.states import RunStatus
from jobs.commands.audit import add_audit_arguments
from jobs.commands.repair import add_repair_arguments
from jobs.options.zookeeper import resolve_connection
from jobs.spark import load
from jobs.tables import delta
from jobs.tables.runs import RunRecord
from jobs.tables.schema import AUDIT_RUNS
from tests.audit_helpers import spark as spark  # the session fixture

REPO = Path(__file__).resolve().parents[2]
# Relative to the checkout (the checker runs in a temporary directory).
AIRFLOW_VENV = REPO / os.environ.get("AIRFLOW_VENV", ".venv-airflow")
AIRFLOW_PY = AIRFLOW_VENV / "bin" / "python"
CHECKER = Path(__file__).with_name("dag_check.py")
SPARK_CONN = {"conn_type": "spark", "host": "local[2]", "extra": {"deploy-mode": "client"}}
# The Airflow major version the venv must hold: the main target unless told otherwise.
AIRFLOW_MAJOR = os.environ.get("BKAUDIT_AIRFLOW_MAJOR", "3")


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
UTC = timezone.utc


def dag_run(logical: datetime | None, run_after: datetime | None = None) -> dict[str, Any]:
    """A DAG run for dag_check.py: Airflow 3 runs may have no logical date."""
    return {
        "logical_date": logical.isoformat() if logical else None,
        "run_after": (run_after or logical or datetime.now(UTC)).isoformat(),
    }


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
        "dag_run": dag_run(datetime(2026, 3, 1, 12, tzinfo=UTC)),
        "xcom": {"audit_run_id": "airflow-20260301T120000-audit-t1"},
    }
    return run_checker(tmp_path_factory.mktemp("dag"), spec, **DEFAULT_ENV)


def test_the_venv_holds_the_expected_airflow(rendered: dict[str, Any]) -> None:
    # A venv silently left on the other line would test the wrong Airflow.
    assert rendered["airflow_version"].split(".")[0] == AIRFLOW_MAJOR, rendered["airflow_version"]


def test_dag_imports_without_errors_and_is_configured(rendered: dict[str, Any]) -> None:
    assert rendered["import_errors"] == {}
    assert rendered["dag_ids"] == ["bookkeeper_audit"]
    assert rendered["files"] == ["bookkeeper_audit.py"]  # not the helpers (.airflowignore)
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
    # The check Param is the check registry's replication checks (bkaudit_support.check_param).
    assert dag["check_param"] == {
        "enum": list(replication_names()),
        "description": dag_description(),
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
        # On an S3 warehouse Spark commits through bkaudit's conditional-PUT log store.
        store = "spark.delta.logStore.s3a.impl=io.bkaudit.delta.ConditionalPutLogStore"
        assert store in c["command"], c["command"]
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


def test_run_without_logical_date_uses_its_run_after(tmp_path: Path) -> None:
    # Airflow 3 lets `airflow dags trigger` and the REST API create runs with no logical date,
    # and then there is no ts_nodash in the context: the run ids come from run_after.
    due = datetime(2026, 3, 2, 9, 15, 30, 123456, tzinfo=timezone(timedelta(hours=1)))
    out = run_checker(tmp_path, {"dag_run": dag_run(None, due)}, **DEFAULT_ENV)
    for task, step in (("audit", "audit"), ("verify_audit", "verify")):
        c = out["commands"][task]
        args = add_audit_arguments(argparse.ArgumentParser()).parse_args(
            _app_args(c["command"], c["application"])
        )
        assert args.run_id == f"airflow-20260302T081530-{step}-t1"  # in UTC


def test_secrets_stay_out_of_rendered_commands(tmp_path: Path) -> None:
    # The scheduler and workers hold the secrets in their environment and in files; the
    # commands (task log, rendered-template view) may name the files, never the secrets.
    zk_auth, password = "ops:zk-s3cret-1", "ledger-s3cret-2"
    auth_file, password_file = tmp_path / "zk-auth", tmp_path / "ledger-password"
    auth_file.write_text(zk_auth + "\n")
    password_file.write_text(password)
    out = run_checker(
        tmp_path,
        {"conf": {"dry_run": False}, "xcom": {"audit_run_id": "r1"}},
        **DEFAULT_ENV,
        BKAUDIT_ZK_AUTH=zk_auth,
        BKAUDIT_PASSWORD=password,
        BKAUDIT_ZK_AUTH_FILE=str(auth_file),
        BKAUDIT_PASSWORD_FILE=str(password_file),
    )
    cmds = out["commands"]
    assert set(cmds) == {"audit", "rereplicate", "verify_audit"}
    text = json.dumps(cmds)
    assert "s3cret" not in text
    assert '"--zk-auth"' not in text and '"--password"' not in text  # only the -file flags
    for task, add_arguments in (
        ("audit", add_audit_arguments),
        ("verify_audit", add_audit_arguments),
        ("rereplicate", add_repair_arguments),
    ):
        c = cmds[task]
        argv = _app_args(c["command"], c["application"])
        parser = add_arguments(argparse.ArgumentParser())
        # The jobs' own parsing turns the paths back into the secrets.
        args = resolve_connection(parser, parser.parse_args(argv), argv)
        assert (args.zk_auth_file, args.zk_auth) == (str(auth_file), zk_auth)
        if task == "rereplicate":
            assert (args.password_file, args.password) == (str(password_file), password)
        else:
            assert "--password-file" not in argv


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
    t0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
    # One DAG run per letter, an hour apart; G is a run with no logical date (Airflow 3).
    when = {k: t0 + timedelta(hours=i) for i, k in enumerate("ABCDEFG")}
    runs = {k: dag_run(None if k == "G" else t, t) for k, t in when.items()}

    def rid(k: str, step: str, attempt: int = 1, prefix: str = "airflow") -> str:
        return f"{prefix}-{when[k]:%Y%m%dT%H%M%S}-{step}-t{attempt}"

    records: list[RunRecord] = []

    def record(run_id: str, status: str, minutes: int, **counts: int) -> None:
        started = t0 + timedelta(minutes=minutes)
        run = RunRecord(run_id, started, "zk:2181", "replicas", status)
        run.finished_at = started + timedelta(seconds=30)
        run.counts = dict(counts)
        run.error = "boom" if status == RunStatus.FAILED else None
        records.append(run)

    # A: first try failed, the retry found 3 ledgers; the verify still finds 1.
    record(rid("A", "audit", 1), RunStatus.FAILED, 0)
    record(rid("A", "audit", 2), RunStatus.COMPLETED, 1, underreplicated_ledgers=3, fragments=4)
    record(rid("A", "verify"), RunStatus.COMPLETED, 5, underreplicated_ledgers=1, fragments=1)
    # B: clean audit, clean verify. C: the audit failed. D: no run at all.
    record(rid("B", "audit"), RunStatus.COMPLETED, 10, fragments=0)
    record(rid("B", "verify"), RunStatus.COMPLETED, 11, fragments=0)
    record(rid("C", "audit"), RunStatus.FAILED, 20)
    # E: the audit could not read everything and found nothing: not clean. F: it could
    # not read everything but found fragments: those are repaired; its verify read less
    # than everything and found nothing, so it does not pass.
    record(rid("E", "audit"), RunStatus.COMPLETED_WITH_ERRORS, 40, ledgers_unaccounted=2)
    record(rid("F", "audit"), RunStatus.COMPLETED_WITH_ERRORS, 50, fragments=2, metadata_errors=1)
    record(rid("F", "verify"), RunStatus.COMPLETED_WITH_ERRORS, 55, fragments=0, metadata_errors=1)
    # G: no logical date; found by its run_after.
    record(rid("G", "audit"), RunStatus.COMPLETED, 60, fragments=1, underreplicated_ledgers=1)
    # Another writer's run that only looks similar must not be picked up.
    record(rid("A", "audit", prefix="manual"), RunStatus.COMPLETED, 30, underreplicated_ledgers=9)
    # The first row through Spark, as the spark-submit jobs write audit_runs in production
    # (Spark creates the table); the rest in one delta-rs commit, since a Spark commit per
    # row takes minutes on a loaded 2-core machine.
    load.write_run_record(spark, warehouse, records[0])
    rows = [r.as_row() for r in records[1:]]
    assert delta.append_rows(warehouse, AUDIT_RUNS, rows) == len(rows)

    out = run_checker(
        tmp_path,
        {
            "conf": {"warehouse": warehouse},
            "branch": [runs[k] for k in "ABCDEFG"],
            "verify": [
                [runs["A"], False],
                [runs["A"], True],
                [runs["B"], False],
                [runs["F"], False],
            ],
        },
        **DEFAULT_ENV,
    )
    br = dict(zip("ABCDEFG", out["branch"], strict=True))
    assert br["A"] == {"branch": "rereplicate", "pushed": {"audit_run_id": rid("A", "audit", 2)}}
    assert br["B"] == {"branch": "no_findings", "pushed": {"audit_run_id": rid("B", "audit")}}
    assert f"{rid('C', 'audit')} is FAILED: boom" in br["C"]["error"]
    assert f"no audit run with id {rid('D', 'audit')[:-1]}*" in br["D"]["error"]
    assert f"{rid('E', 'audit')} is COMPLETED_WITH_ERRORS" in br["E"]["error"]
    assert "2 ledgers unaccounted for" in br["E"]["error"] and "not clean" in br["E"]["error"]
    assert br["F"] == {"branch": "rereplicate", "pushed": {"audit_run_id": rid("F", "audit")}}
    assert br["G"] == {"branch": "rereplicate", "pushed": {"audit_run_id": rid("G", "audit")}}
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
    cet = timezone(timedelta(hours=1))

    class Run:
        def __init__(self, logical: datetime | None, after: datetime | None) -> None:
            self.run_id, self.logical_date, self.run_after = "r", logical, after

    t1, t2 = datetime(2026, 1, 1, 1, 2, 3, tzinfo=cet), datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert s.run_stamp(Run(t1, t2)) == "20260101T000203"  # the logical date, in UTC
    assert s.run_stamp(Run(None, t2)) == "20260506T070809"  # no logical date: run_after
    with pytest.raises(RuntimeError, match="no date"):
        s.run_stamp(Run(None, None))
    assert s.secret_file_args(None, None) == []
    assert s.secret_file_args("/a", "/b") == ["--zk-auth-file", "/a", "--password-file", "/b"]
    assert s.run_id_prefix("20260101T000000", "audit") == "airflow-20260101T000000-audit-t"
    run = {"run_id": "r", "status": "COMPLETED", "counts": {"fragments": 0}}
    assert s.choose_branch(run, "r") == "no_findings"
    with pytest.raises(RuntimeError, match="no audit run"):
        s.choose_branch(None, "x-")
