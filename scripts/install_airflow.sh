#!/usr/bin/env bash
# Install Apache Airflow into its own virtualenv (.venv-airflow), separate from the Spark venv:
# Airflow pins its own SQLAlchemy/Flask/pendulum and must not fight PySpark over versions.
# Idempotent: a stamp file records the pins; the install runs again only when they change.
#
#   scripts/install_airflow.sh            # creates .venv-airflow next to this repo
#   AIRFLOW_VENV=/opt/af scripts/install_airflow.sh
#
# No Airflow constraints file is reachable from CI, so the packages that break Airflow 2.10
# when left to float are pinned here explicitly.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${AIRFLOW_VENV:-$ROOT/.venv-airflow}"
# Airflow 2.10 supports Python 3.8-3.12; prefer 3.11 (what the project's CI runs).
PYTHON="${AIRFLOW_PYTHON:-$(command -v python3.11 || command -v python3)}"

PINS=(
  "apache-airflow==2.10.5"
  "apache-airflow-providers-apache-spark==4.11.3"
  # delta-rs: the branch task reads audit_runs without a JVM on the Airflow worker.
  "deltalake==0.25.5"
  "pyarrow==17.0.0"
  # Left floating these break Airflow 2.10 (marshmallow 4 drops fields FAB uses,
  # SQLAlchemy 2 is not supported by Airflow 2.x, connexion 3 is a rewrite).
  "marshmallow<4"
  "SQLAlchemy>=1.4.36,<2.0"
  "Flask-Session<0.6"
  "connexion<3"
  "werkzeug<3"
)
STAMP="$VENV/.bkaudit-installed"
WANT="$(printf '%s\n' "$PYTHON" "${PINS[@]}")"

if [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$WANT" ]] && [[ -x "$VENV/bin/airflow" ]]; then
  echo "airflow venv up to date: $VENV"
  exit 0
fi

"$PYTHON" -m venv "$VENV"
# Keep git, ruff and pytest out of the venv (Python 3.13's venv writes this file itself).
echo '*' >"$VENV/.gitignore"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "${PINS[@]}"
# Smoke: the CLI starts and the provider imports.
AIRFLOW_HOME="$(mktemp -d)" "$VENV/bin/python" -c \
  "import airflow, airflow.providers.apache.spark.hooks.spark_submit as s; print(airflow.__version__)"
printf '%s' "$WANT" >"$STAMP"
echo "airflow installed in $VENV"
