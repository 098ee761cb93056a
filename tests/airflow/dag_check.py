"""Run by the Airflow virtualenv's python (never by pytest itself): load the DAG folder into a
DagBag and print JSON describing it. tests/airflow/test_dag.py asserts on the output. Works on
Airflow 3 (the main target, .venv-airflow) and Airflow 2.10 (.venv-airflow2).

    .venv-airflow/bin/python tests/airflow/dag_check.py '{"conf": {...}, "branch": [...]}'

Input (JSON, argv[1]); a DAG run is ``{"logical_date": ISO or null, "run_after": ISO}``:
  conf       params for rendering (merged over the DAG's defaults)
  dag_run    the DAG run to render for (default: logical date 2026-01-01T00:00:00Z)
  xcom       {key: value} that ``ti.xcom_pull`` returns while rendering
  branch     [DAG run, ...]: call check_findings' callable for each (reads the warehouse)
  verify     [[DAG run, dry_run], ...]: call verify_result's callable for each

Output: the Airflow version, import_errors, the DAG's attributes, every task's edges and
trigger rule, the spark-submit command each SparkSubmitOperator would run (built by the
provider's own SparkSubmitHook._build_spark_submit_command) with all its rendered template
fields, and the branch/verify results (each list in input order).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime
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


@dataclass
class FakeDagRun:
    """What the templates and the task callables use of a DagRun: Airflow 3 runs may have no
    logical date (manual triggers), and always have run_after."""

    run_id: str
    logical_date: datetime | None
    run_after: datetime


def fake_dag_run(spec: dict[str, Any] | None) -> FakeDagRun:
    """A FakeDagRun from ``{"logical_date": ISO or null, "run_after": ISO}``."""
    spec = spec or {"logical_date": "2026-01-01T00:00:00+00:00"}
    logical = spec.get("logical_date")
    after = spec.get("run_after") or logical
    assert after, f"a DAG run needs logical_date or run_after: {spec}"
    return FakeDagRun(
        run_id=f"manual__{after}",
        logical_date=datetime.fromisoformat(logical) if logical else None,
        run_after=datetime.fromisoformat(after),
    )


def load_dag_bag() -> Any:
    """The DAG folder in a DagBag, wherever this Airflow keeps the class."""
    from airflow import settings

    try:  # Airflow 3
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 2.10
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]
    # Examples are off through AIRFLOW__CORE__LOAD_EXAMPLES (Airflow 3 has no argument).
    return DagBag(settings.DAGS_FOLDER)


def main() -> int:
    spec = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    import airflow
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    bag = load_dag_bag()
    out: dict[str, Any] = {
        "airflow_version": airflow.__version__,
        "import_errors": {k: str(v) for k, v in bag.import_errors.items()},
        "dag_ids": sorted(bag.dag_ids),
        # The files the DagBag parsed: .airflowignore must keep the helpers out.
        "files": sorted(os.path.basename(s.file) for s in bag.dagbag_stats),
    }
    dag = bag.dags.get("bookkeeper_audit")
    if dag is None:
        print("BKAUDIT-DAG-CHECK " + json.dumps(out))
        return 0
    params = {k: dag.params[k] for k in dag.params}
    out["dag"] = {
        # Airflow 3 keeps the argument as `schedule`; 2.10 as `schedule_interval`.
        "schedule": str(getattr(dag, "schedule", None) or dag.schedule_interval),
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "tags": sorted(dag.tags),
        "doc_md": dag.doc_md or "",
        "default_args": {k: str(v) for k, v in dag.default_args.items()},
        "params": params,
    }
    # The check Param's choices and text, which the DAG takes from bkaudit's check registry.
    check = dag.params.get_param("check")
    out["dag"]["check_param"] = {
        "enum": check.schema.get("enum"),
        "description": check.description,
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
    dag_run = fake_dag_run(spec.get("dag_run"))
    commands = {}
    for t in dag.tasks:
        if not isinstance(t, SparkSubmitOperator):
            continue
        task = copy.deepcopy(t)
        ti = FakeTaskInstance(spec.get("xcom", {}))
        # What Airflow's own context would give these templates; ts_nodash only when the run
        # has a logical date, as in Airflow 3 (the DAG must not rely on it).
        context: dict[str, Any] = {
            "params": conf,
            "dag_run": dag_run,
            "run_id": dag_run.run_id,
            "ti": ti,
            "task": task,
            "dag": dag,
        }
        if dag_run.logical_date is not None:
            context["ts_nodash"] = dag_run.logical_date.strftime("%Y%m%dT%H%M%S")
        task.render_template_fields(context)
        hook = task._get_hook()
        commands[t.task_id] = {
            "command": hook._build_spark_submit_command(task.application),
            "env_vars": task.env_vars,
            "application": task.application,
            "rendered": {f: getattr(task, f, None) for f in task.template_fields},
        }
    out["commands"] = commands

    branch = dag.get_task("check_findings").python_callable
    out["branch"] = []
    for run_spec in spec.get("branch", []):
        ti = FakeTaskInstance({})
        try:
            chosen = branch(params=conf, dag_run=fake_dag_run(run_spec), ti=ti)
            out["branch"].append({"branch": chosen, "pushed": ti.pushed})
        except Exception as exc:
            out["branch"].append({"error": f"{type(exc).__name__}: {exc}"})
    verify = dag.get_task("verify_result").python_callable
    out["verify"] = []
    for run_spec, dry in spec.get("verify", []):
        try:
            summary = verify(params={**conf, "dry_run": dry}, dag_run=fake_dag_run(run_spec))
            out["verify"].append({"dry_run": dry, "passed": True, "summary": summary})
        except Exception as exc:
            out["verify"].append(
                {
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
