#!/usr/bin/env bash
# End to end, by hand or nightly (about 5 minutes on 2 cores, so not in `make test`):
# `airflow dags test bookkeeper_audit` against a throw-away sandbox. ZooKeeper and 4 Python
# bookies, 12 ledgers written, one bookie stopped; the DAG must audit, branch to rereplicate,
# repair, and pass its verifying audit. Needs .venv and .venv-airflow.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mktemp -d)"
SB=$WORK/sandbox WH=$WORK/warehouse
export AIRFLOW_HOME=$WORK/airflow
cd "$ROOT"
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
.venv-airflow/bin/airflow db migrate >/dev/null
.venv-airflow/bin/airflow dags test bookkeeper_audit "$(date -u +%Y-%m-%dT%H:%M:%S+00:00)" \
  --conf '{"check": "lost", "grace_period": "0s", "rate": "0"}' >"$WORK/dags-test.log" 2>&1 || {
  tail -50 "$WORK/dags-test.log"
  exit 1
}
grep -E "Marking task as|verifying audit" "$WORK/dags-test.log" | sed 's/.*INFO - //' | sort -u
for t in audit check_findings rereplicate verify_audit verify_result; do
  grep -q "Marking task as SUCCESS. dag_id=bookkeeper_audit, task_id=$t," "$WORK/dags-test.log" \
    || { echo "task $t did not succeed"; exit 1; }
done
.venv/bin/bkaudit listunderreplicated --warehouse "$WH"  # exit 0: clean after the repair
echo "OK: $WORK"
