"""
### bookkeeper_audit

Audit a BookKeeper cluster, repair what the audit found, and audit again to verify.

```
audit ─▶ check_findings ─┬─▶ rereplicate ─▶ verify_audit ─▶ verify_result
                         └─▶ no_findings
```

* **audit**: `spark-submit jobs/audit.py --zk … --warehouse … --check …` with the run id
  `airflow-<ts_nodash>-audit-t<try>` (a run without a logical date, which Airflow 3 allows
  for manual triggers, uses the time it was due instead of `ts_nodash`).
* **check_findings**: reads that run's row of `audit_runs` with delta-rs (no Spark on the
  worker) and branches: `rereplicate` when it found under-replicated fragments, `no_findings`
  when clean. A failed or missing run fails the task: never "clean" for an audit that did not
  finish. It also runs after an audit task that failed with exit 3 (an incomplete run, after
  its retries), so that what that run did find is repaired; an incomplete run that found
  nothing fails it.
* **rereplicate**: `spark-submit jobs/rereplicate.py --run-id <that audit run>` with the grace
  period, rate and dry-run params. It exits 1 while ledgers still need work (waiting for the
  grace period, locked, failed, no replica); the task then fails and is retried after
  `retry_delay` (5 min, longer than the default 30 s grace period), which fences and closes the
  open ledgers that were waiting.
* **verify_audit** runs when `rereplicate` ran, whether it succeeded or not (trigger rule
  `none_skipped`), so every repair is followed by a fresh picture of the cluster.
* **verify_result** fails the DAG run when the verifying audit still finds under-replicated
  ledgers (not on a dry run). The report is then in `bkaudit listunderreplicated` and
  `bkaudit report`.

Params (Trigger DAG w/ config): `zk`, `warehouse` (defaults from `$BKAUDIT_ZK` and
`$BKAUDIT_WAREHOUSE` on the scheduler), `check`, `grace_period`, `rate`, `dry_run`.
Deployment: `$BKAUDIT_HOME` is the bkaudit checkout on the workers (default: the parent of this
folder), `$BKAUDIT_SPARK_CONN_ID` the Spark connection (default `spark_bkaudit`);
`SPARK_CONF_DIR=$BKAUDIT_HOME/conf` gives spark-submit the Delta settings. Secrets never go on
the command line: `$BKAUDIT_ZK_AUTH_FILE` / `$BKAUDIT_PASSWORD_FILE` (paths on the workers)
become `--zk-auth-file` / `--password-file`, or `$BKAUDIT_ZK_AUTH` / `$BKAUDIT_PASSWORD` in the
workers' environment reach the jobs directly. Airflow 3 (task SDK) and 2.10. See
docs/operations.md.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum

# Airflow 3 (the main target): DAG authoring comes from the task SDK, EmptyOperator from the
# standard provider. Airflow 2.10, also supported, has neither; it has the old locations.
try:
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, Param, TriggerRule, task
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # Airflow 2.10
    from airflow import DAG
    from airflow.decorators import task
    from airflow.exceptions import AirflowFailException
    from airflow.models.param import Param
    from airflow.operators.empty import EmptyOperator
    from airflow.utils.trigger_rule import TriggerRule
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers next to this file
from bkaudit_support import (
    TASK_CLEAN,
    TASK_REPAIR,
    check_param,
    choose_branch,
    drop_empty,
    find_run,
    read_audit_runs,
    run_id_prefix,
    run_stamp,
    secret_file_args,
    verification_outcome,
)

log = logging.getLogger(__name__)

BKAUDIT_HOME = os.environ.get("BKAUDIT_HOME", str(Path(__file__).resolve().parents[1]))
SPARK_CONN_ID = os.environ.get("BKAUDIT_SPARK_CONN_ID", "spark_bkaudit")
SCHEDULE = os.environ.get("BKAUDIT_DAG_SCHEDULE", "@hourly")
# delta-rs options for object stores (JSON), e.g. {"AWS_REGION": "eu-west-1"}.
STORAGE_OPTIONS: dict[str, str] = json.loads(os.environ.get("BKAUDIT_DELTA_STORAGE_OPTIONS", "{}"))
# Secrets as files on the workers, never as values: a job's arguments are in the task log and
# the rendered-template view. $BKAUDIT_ZK_AUTH / $BKAUDIT_PASSWORD in the worker's environment
# work too (spark-submit inherits it, in client deploy mode).
ZK_AUTH_FILE = os.environ.get("BKAUDIT_ZK_AUTH_FILE") or None
PASSWORD_FILE = os.environ.get("BKAUDIT_PASSWORD_FILE") or None

# run_stamp(dag_run) is ts_nodash, or the run's run_after when an Airflow 3 run has no logical
# date (and so no ts_nodash); see bkaudit_support.run_stamp.
AUDIT_RUN_ID = "airflow-{{ bkaudit_run_stamp(dag_run) }}-audit-t{{ ti.try_number }}"
VERIFY_RUN_ID = "airflow-{{ bkaudit_run_stamp(dag_run) }}-verify-t{{ ti.try_number }}"
ZK_WAREHOUSE = [
    "--zk",
    "{{ params.zk }}",
    "--warehouse",
    "{{ params.warehouse }}",
    *secret_file_args(ZK_AUTH_FILE),
]


class BkauditSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit of a bkaudit job; arguments that render empty are dropped, so a flag can
    be conditional on a param."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        super().render_template_fields(context, jinja_env)
        rendered: list[str] = getattr(self, "application_args", None) or []
        self.application_args = drop_empty(rendered)


def _s3_settings() -> tuple[dict[str, str], str | None]:
    """spark-submit's settings for a warehouse on S3 (docs/tables.md, "Object storage"):
    bkaudit's Delta log store (it applies to s3a:// paths only, so it is always given), the
    s3a settings of this environment's AWS variables, and the s3a jars when ``python -m
    jobs.spark.s3`` fetched them on this host (None otherwise)."""
    from jobs.spark.s3 import S3SetupError, s3_jars, s3a_conf

    try:
        jars: str | None = ",".join(s3_jars(fetch=False))
    except S3SetupError:
        jars = None
    return s3a_conf(), jars


def _spark_task(task_id: str, job: str, args: list[str], **kwargs: Any) -> SparkSubmitOperator:
    s3_conf, s3_jars = _s3_settings()
    return BkauditSparkSubmitOperator(
        task_id=task_id,
        conn_id=SPARK_CONN_ID,
        application=f"{BKAUDIT_HOME}/jobs/{job}",
        name=f"bkaudit-{task_id}",
        application_args=args,
        # spark-defaults.conf (Delta jars and SQL extensions) and log4j2 settings.
        env_vars={"SPARK_CONF_DIR": f"{BKAUDIT_HOME}/conf"},
        # Console progress bars turn into thousands of lines in a task log.
        conf={"spark.ui.showConsoleProgress": "false", **s3_conf},
        jars=s3_jars,
        py_files=os.environ.get("BKAUDIT_PY_FILES") or None,
        execution_timeout=timedelta(hours=4),
        **kwargs,
    )


with DAG(
    dag_id="bookkeeper_audit",
    description="Audit BookKeeper, re-replicate what is under-replicated, verify",
    doc_md=__doc__,
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    # An audit describes the cluster now; re-running missed hours would audit the same state.
    catchup=False,
    max_active_runs=1,  # two repairs of the same findings would contend for the ledger locks
    dagrun_timeout=timedelta(hours=8),
    tags=["bookkeeper", "bkaudit", "repair"],
    default_args={
        "owner": "bookkeeper-ops",
        "retries": 2,
        "retry_delay": timedelta(minutes=5),
        "depends_on_past": False,
    },
    params={
        "zk": Param(
            os.environ.get("BKAUDIT_ZK", ""),
            type="string",
            minLength=1,
            description="ZooKeeper connect string HOST:PORT[/chroot] (default $BKAUDIT_ZK)",
        ),
        "warehouse": Param(
            os.environ.get("BKAUDIT_WAREHOUSE", ""),
            type="string",
            minLength=1,
            description="directory or URI of the Delta tables (default $BKAUDIT_WAREHOUSE)",
        ),
        "check": Param(**check_param()),  # from the check registry (bklib.audit.checks)
        "grace_period": Param(
            "30s", type="string", description="open ledgers are fenced only after this long"
        ),
        "rate": Param("50MB", type="string", description="bytes/s per task (50MB, 0=unlimited)"),
        "dry_run": Param(False, type="boolean", description="plan the repair, change nothing"),
    },
    render_template_as_native_obj=False,
    user_defined_macros={"bkaudit_run_stamp": run_stamp},
) as dag:
    audit = _spark_task(
        "audit",
        "audit.py",
        [*ZK_WAREHOUSE, "--check", "{{ params.check }}", "--run-id", AUDIT_RUN_ID],
    )

    # ALL_DONE: an audit that exits 3 (incomplete, docs/exit-status.md) fails its task, yet
    # what it did find is repaired; choose_branch refuses a FAILED run, and an incomplete one
    # that found nothing, so the DAG run never ends green on a partial picture.
    @task.branch(task_id="check_findings", retries=1, trigger_rule=TriggerRule.ALL_DONE)
    def check_findings(params: Any = None, dag_run: Any = None, ti: Any = None) -> str:
        """Branch on the audit run this DAG run just wrote (read with delta-rs)."""
        prefix = run_id_prefix(run_stamp(dag_run), "audit")
        run = find_run(read_audit_runs(params["warehouse"], STORAGE_OPTIONS), prefix)
        branch = choose_branch(run, prefix)
        assert run is not None
        log.info("audit %s: %s -> %s", run["run_id"], run["counts"], branch)
        ti.xcom_push(key="audit_run_id", value=run["run_id"])
        return branch

    rereplicate = _spark_task(
        TASK_REPAIR,
        "rereplicate.py",
        [
            *ZK_WAREHOUSE,
            "--run-id",
            "{{ ti.xcom_pull(task_ids='check_findings', key='audit_run_id') }}",
            "--grace-period",
            "{{ params.grace_period }}",
            "--rate",
            "{{ params.rate }}",
            "{{ '--dry-run' if params.dry_run else '' }}",
            *secret_file_args(None, PASSWORD_FILE),
        ],
    )
    no_findings = EmptyOperator(task_id=TASK_CLEAN)
    verify_audit = _spark_task(
        "verify_audit",
        "audit.py",
        [*ZK_WAREHOUSE, "--check", "{{ params.check }}", "--run-id", VERIFY_RUN_ID],
        trigger_rule=TriggerRule.NONE_SKIPPED,
    )

    # NONE_SKIPPED: an incomplete verifying audit (exit 3) is judged here too, and fails.
    @task(task_id="verify_result", retries=0, trigger_rule=TriggerRule.NONE_SKIPPED)
    def verify_result(params: Any = None, dag_run: Any = None) -> str:
        """Fail the DAG run when the verifying audit still finds under-replicated ledgers."""
        prefix = run_id_prefix(run_stamp(dag_run), "verify")
        run = find_run(read_audit_runs(params["warehouse"], STORAGE_OPTIONS), prefix)
        passed, summary = verification_outcome(run, prefix, dry_run=bool(params["dry_run"]))
        log.info(summary)
        if not passed:
            raise AirflowFailException(summary)
        return summary

    branch = check_findings()
    audit >> branch >> [rereplicate, no_findings]
    rereplicate >> verify_audit >> verify_result()
