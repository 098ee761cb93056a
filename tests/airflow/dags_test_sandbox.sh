#!/usr/bin/env bash
# End to end, in `make soak` (several minutes on 2 cores, too long for `make test`):
# `airflow dags test bookkeeper_audit` against a throw-away sandbox. ZooKeeper and 4 Python
# bookies, 12 ledgers written, one bookie stopped; the DAG must audit, branch to rereplicate,
# repair, and pass its verifying audit. Needs .venv and the Airflow venv:
#
#   tests/airflow/dags_test_sandbox.sh                               # Airflow 3, .venv-airflow
#   AIRFLOW_VENV=.venv-airflow2 tests/airflow/dags_test_sandbox.sh   # Airflow 2.10
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
AF_VENV="$(cd "$ROOT" && realpath "${AIRFLOW_VENV:-.venv-airflow}")"
[[ -x "$AF_VENV/bin/airflow" ]] || { echo "no Airflow in $AF_VENV: run scripts/install_airflow.sh" >&2; exit 1; }
WORK="$(mktemp -d)"
SB=$WORK/sandbox WH=$WORK/warehouse
export AIRFLOW_HOME=$WORK/airflow
cd "$ROOT"
started=$SECONDS
trap '.venv/bin/bkaudit sandbox down --dir "$SB" >/dev/null 2>&1 || true' EXIT
.venv/bin/bkaudit sandbox up --dir "$SB" --bookies 4
state() { .venv/bin/python -c "import json,sys; s=json.load(open('$SB/sandbox.json')); print($1)"; }
ZK=$(state "s['zk']")
.venv/bin/python -c "
import asyncio
from bklib.testing.workload import write_ledgers
print('wrote', len(asyncio.run(write_ledgers('$ZK', 12, max_entries=40))), 'ledgers')"
kill "$(state "s['bookies'][-1]['pid']")"  # SIGTERM: the bookie unregisters
sleep 3

export PATH=$ROOT/.venv/bin:$PATH PYSPARK_PYTHON=$ROOT/.venv/bin/python
export AIRFLOW__CORE__DAGS_FOLDER=$ROOT/airflow_dags AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW_CONN_SPARK_BKAUDIT='{"conn_type": "spark", "host": "local[2]", "extra": {"deploy-mode": "client"}}'
export BKAUDIT_ZK=$ZK BKAUDIT_WAREHOUSE=$WH
"$AF_VENV/bin/airflow" version
"$AF_VENV/bin/airflow" db migrate >/dev/null
"$AF_VENV/bin/airflow" dags test bookkeeper_audit "$(date -u +%Y-%m-%dT%H:%M:%S+00:00)" \
  --conf '{"check": "lost", "grace_period": "0s", "rate": "0"}' >"$WORK/dags-test.log" 2>&1 || {
  tail -80 "$WORK/dags-test.log"
  exit 1
}
grep -E "verifying audit" "$WORK/dags-test.log" | sed 's/.*INFO - //' | sort -u || true
# Task states from Airflow's own database (the log wording differs between Airflow 2 and 3).
STATES=$("$AF_VENV/bin/python" -c "
import json
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
with create_session() as s:
    rows = s.query(TaskInstance.task_id, TaskInstance.state).filter(
        TaskInstance.dag_id == 'bookkeeper_audit').all()
print(json.dumps({t: getattr(st, 'value', st) for t, st in rows}, sort_keys=True))")
echo "task states: $STATES"
EXPECTED='{"audit": "success", "check_findings": "success", "no_findings": "skipped", "rereplicate": "success", "verify_audit": "success", "verify_result": "success"}'
[[ "$STATES" == "$EXPECTED" ]] || {
  echo "expected $EXPECTED"
  tail -80 "$WORK/dags-test.log"
  exit 1
}
.venv/bin/bkaudit listunderreplicated --warehouse "$WH"  # exit 0: clean after the repair
echo "OK in $((SECONDS - started)) s: $WORK"
