#!/usr/bin/env bash
# Install Apache Airflow into its own virtualenv, separate from the Spark venv: Airflow pins its
# own SQLAlchemy/FastAPI/pendulum and must not fight PySpark over versions.
#
#   scripts/install_airflow.sh                  # Airflow 3 (the main target) in .venv-airflow
#   AIRFLOW_LINE=2 scripts/install_airflow.sh   # Airflow 2.10 in .venv-airflow2 (make airflow2-test)
#   AIRFLOW_VENV=/opt/af scripts/install_airflow.sh
#   AIRFLOW_RESOLVE=1 scripts/install_airflow.sh  # re-resolve PINS and rewrite the lock file
#
# Airflow's own constraints files live on GitHub, which CI cannot reach. The lock files in
# scripts/airflow/ play their part: the whole set resolved once from PyPI for PINS (on Python
# 3.11, Linux) and frozen, so every install gets exactly the versions the tests passed with.
# The venv is synced to the lock (packages not in it are removed, so a 2.10 venv upgrades in
# place) by uv, which installs the ~140 packages in well under a minute where pip needs several.
# Idempotent: a stamp records Python, the pins and the lock's hash; a rerun with nothing
# changed returns at once.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LINE="${AIRFLOW_LINE:-3}"
case "$LINE" in
  3)
    AIRFLOW_VERSION=3.3.2
    DEFAULT_VENV="$ROOT/.venv-airflow"
    PINS=(
      "apache-airflow==$AIRFLOW_VERSION"
      # 6.x: the Airflow 3 provider (task SDK); it needs Airflow >= 2.11.
      "apache-airflow-providers-apache-spark==6.3.4"
      # EmptyOperator and the @task.branch decorator moved here in Airflow 3.
      "apache-airflow-providers-standard==1.21.0"
      # delta-rs: the branch task reads audit_runs without a JVM on the Airflow worker,
      # through jobs.tables.delta, which needs deltalake 1.x like the main package.
      "deltalake==1.6.6"
      "pyarrow==26.0.1"
    )
    ;;
  2)
    AIRFLOW_VERSION=2.10.5
    DEFAULT_VENV="$ROOT/.venv-airflow2"
    PINS=(
      "apache-airflow==$AIRFLOW_VERSION"
      # The last provider line for Airflow < 2.11.
      "apache-airflow-providers-apache-spark==4.11.3"
      "deltalake==1.6.6"
      "pyarrow==26.0.1"
      # Left floating these break Airflow 2.10 (marshmallow 4 drops fields FAB uses,
      # SQLAlchemy 2 is not supported by Airflow 2.x, connexion 3 is a rewrite).
      "marshmallow<4"
      "SQLAlchemy>=1.4.36,<2.0"
      "Flask-Session<0.6"
      "connexion<3"
      "werkzeug<3"
    )
    ;;
  *)
    echo "AIRFLOW_LINE must be 3 or 2, not '$LINE'" >&2
    exit 2
    ;;
esac
VENV="${AIRFLOW_VENV:-$DEFAULT_VENV}"
# Airflow 3.3 supports Python 3.10-3.13 and 2.10 3.8-3.12; the locks were resolved on 3.11
# (what the project's CI runs), so prefer it.
PYTHON="${AIRFLOW_PYTHON:-$(command -v python3.11 || command -v python3)}"
LOCK="$ROOT/scripts/airflow/constraints-$AIRFLOW_VERSION.txt"
# shellcheck source=uv.sh
source "$ROOT/scripts/uv.sh"

STAMP="$VENV/.bkaudit-installed"
want() {
  printf '%s\n' "$PYTHON" "$("$PYTHON" -V 2>&1)" "uv $UV_VERSION" "${PINS[@]}"
  sha256sum "$LOCK" | cut -c1-16
}

if [[ "${AIRFLOW_RESOLVE:-0}" != 1 ]] && [[ -f "$STAMP" ]] && [[ -f "$LOCK" ]] \
  && [[ "$(cat "$STAMP")" == "$(want)" ]] && [[ -x "$VENV/bin/airflow" ]]; then
  echo "airflow venv up to date: $VENV (Airflow $AIRFLOW_VERSION)"
  exit 0
fi

# A venv made by another Python cannot be synced in place: start it again.
if [[ -x "$VENV/bin/python" ]] \
  && [[ "$("$VENV/bin/python" -V 2>&1)" != "$("$PYTHON" -V 2>&1)" ]]; then
  rm -rf "$VENV"
fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv --without-pip "$VENV"
# Keep git, ruff and pytest out of the venv (Python 3.13's venv writes this file itself).
echo '*' >"$VENV/.gitignore"
rm -f "$STAMP"

if [[ "${AIRFLOW_RESOLVE:-0}" == 1 ]]; then
  # Resolve the pins afresh for this Python and write the new lock.
  work="$(mktemp -d)"
  printf '%s\n' "${PINS[@]}" >"$work/pins.in"
  "$UV" pip compile -q --python "$VENV/bin/python" --no-header --no-annotate \
    "$work/pins.in" -o "$work/lock.txt"
  mkdir -p "$(dirname "$LOCK")"
  {
    echo "# Airflow $AIRFLOW_VERSION lock for scripts/install_airflow.sh (AIRFLOW_LINE=$LINE):"
    echo "# $("$VENV/bin/python" -V 2>&1), $(uname -sm), resolved $(date -u +%Y-%m-%d) from:"
    printf '#   %s\n' "${PINS[@]}"
    echo "# Regenerate: AIRFLOW_LINE=$LINE AIRFLOW_RESOLVE=1 scripts/install_airflow.sh"
    cat "$work/lock.txt"
  } >"$LOCK"
  rm -rf "$work"
  echo "wrote $LOCK"
fi
"$UV" pip sync -q --python "$VENV/bin/python" "$LOCK"
# The lock must hold what PINS ask for: after a pin change without a new lock, fail here.
"$UV" pip install --python "$VENV/bin/python" --dry-run --offline "${PINS[@]}" 2>&1 \
  | grep -q "Would make no changes" \
  || { echo "$LOCK does not satisfy the pins: rerun with AIRFLOW_RESOLVE=1" >&2; exit 1; }

# Smoke: Airflow, the Spark provider and delta-rs import, in the version the lock holds.
home="$(mktemp -d)"
AIRFLOW_HOME="$home" "$VENV/bin/python" -c "
import airflow, deltalake
import airflow.providers.apache.spark.operators.spark_submit
assert airflow.__version__ == '$AIRFLOW_VERSION', airflow.__version__
print('Airflow', airflow.__version__, 'deltalake', deltalake.__version__)"
rm -rf "$home"
want >"$STAMP"
echo "airflow installed in $VENV"
