"""Run by the Airflow virtualenv's python (never by pytest itself): load the DAG folder into a
DagBag and print JSON describing it. tests/airflow/test_dag.py asserts on the output.

    .venv-airflow/bin/python tests/airflow/dag_check.py '{"conf": {...}, "branch": [...]}'

Input (JSON, argv[1]):
  conf       params for rendering (merged over the DAG's defaults)
  ts_nodash  logical date for rendering
  xcom       {key: value} that ``ti.xcom_pull`` returns while rendering
  branch     [ts_nodash, ...]: call check_findings' callable for each (reads the warehouse)
  verify     [[ts_nodash, dry_run], ...]: call verify_result's callable for each

Output: import_errors, the DAG's attributes, every task's edges and trigger rule, the
spark-submit command each SparkSubmitOperator would run (built by the provider's own
SparkSubmitHook._build_spark_submit_command) and the branch/verify results.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any


class FakeTaskInstance:
    """What the templates and the task callables use of a TaskInstance."""

    def __init__(self, xcom: dict[str, Any], try_number: int = 1) -> None:
        self.try_number = try_number
        self.xcom = dict(xcom)
        self.pushed: dict[str, Any] = {}

    def xcom_pull(self, task_ids: Any = None, key: str = "return_value", **_: Any) -> Any:
        return self.xcom.get(key)

    def xcom_push(self, key: str, value: Any, **_: Any) -> None:
        self.pushed[key] = value


def main() -> int:
    spec = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    from airflow import settings
    from airflow.models.dagbag import DagBag
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    bag = DagBag(settings.DAGS_FOLDER, include_examples=False)
    out: dict[str, Any] = {
        "import_errors": {k: str(v) for k, v in bag.import_errors.items()},
        "dag_ids": sorted(bag.dag_ids),
    }
    dag = bag.dags.get("bookkeeper_audit")
    if dag is None:
        print("BKAUDIT-DAG-CHECK " + json.dumps(out))
        return 0
    params = {k: dag.params[k] for k in dag.params}
    out["dag"] = {
        "schedule": str(dag.schedule_interval),
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "tags": sorted(dag.tags),
        "doc_md": dag.doc_md or "",
        "default_args": {k: str(v) for k, v in dag.default_args.items()},
        "params": params,
    }
    out["tasks"] = {
        t.task_id: {
            "operator": type(t).__name__,
            "upstream": sorted(t.upstream_task_ids),
            "downstream": sorted(t.downstream_task_ids),
            "trigger_rule": str(
                t.trigger_rule.value if hasattr(t.trigger_rule, "value") else t.trigger_rule
            ),
            "retries": t.retries,
            "is_spark_submit": isinstance(t, SparkSubmitOperator),
        }
        for t in dag.tasks
    }
    conf = {**params, **spec.get("conf", {})}
    ts = spec.get("ts_nodash", "20260101T000000")
    commands = {}
    for t in dag.tasks:
        if not isinstance(t, SparkSubmitOperator):
            continue
        task = copy.deepcopy(t)
        ti = FakeTaskInstance(spec.get("xcom", {}))
        context = {"params": conf, "ts_nodash": ts, "ti": ti, "task": task, "dag": dag}
        task.render_template_fields(context)
        hook = task._get_hook()
        commands[t.task_id] = {
            "command": hook._build_spark_submit_command(task.application),
            "env_vars": task.env_vars,
            "application": task.application,
        }
    out["commands"] = commands

    branch = dag.get_task("check_findings").python_callable
    out["branch"] = {}
    for b_ts in spec.get("branch", []):
        ti = FakeTaskInstance({})
        try:
            chosen = branch(params=conf, ts_nodash=b_ts, ti=ti)
            out["branch"][b_ts] = {"branch": chosen, "pushed": ti.pushed}
        except Exception as exc:
            out["branch"][b_ts] = {"error": f"{type(exc).__name__}: {exc}"}
    verify = dag.get_task("verify_result").python_callable
    out["verify"] = []
    for v_ts, dry in spec.get("verify", []):
        try:
            summary = verify(params={**conf, "dry_run": dry}, ts_nodash=v_ts)
            out["verify"].append({"ts": v_ts, "dry_run": dry, "passed": True, "summary": summary})
        except Exception as exc:
            out["verify"].append(
                {
                    "ts": v_ts,
                    "dry_run": dry,
                    "passed": False,
                    "error": type(exc).__name__,
                    "summary": str(exc),
                }
            )
    print("BKAUDIT-DAG-CHECK " + json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # delta-rs' runtime threads can abort the interpreter's shutdown ("terminate called
    # without an active exception"); everything is printed by now, so skip the teardown.
    os._exit(code)
