#!/bin/bash
# Entrypoint of the bkaudit-spark image. Spark on Kubernetes starts executor pods from this
# image with the single argument `executor` and describes the executor in environment
# variables (Spark's KubernetesExecutorBuilder / BasicExecutorFeatureStep, the contract of
# Spark's own image entrypoint): that case starts Spark's KubernetesExecutorBackend. Anything
# else is a bkaudit command. Either way the process replaces this shell, so it is PID 1 and
# gets SIGTERM itself.
set -euo pipefail

if [[ "${1:-}" == "executor" ]]; then
  shift
  spark_home="$(/opt/bkaudit/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
  # spark.executor.extraJavaOptions and Spark's own options arrive as SPARK_JAVA_OPT_0, _1, ...
  java_opts=()
  while IFS= read -r opt; do
    java_opts+=("$opt")
  done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
  exec java "${java_opts[@]}" \
    -Xms"${SPARK_EXECUTOR_MEMORY:?}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
    -cp "${SPARK_CONF_DIR}:${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}${spark_home}/jars/*" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "${SPARK_DRIVER_URL:?}" \
    --executor-id "${SPARK_EXECUTOR_ID:?}" \
    --cores "${SPARK_EXECUTOR_CORES:?}" \
    --app-id "${SPARK_APPLICATION_ID:?}" \
    --hostname "${SPARK_EXECUTOR_POD_IP:?}" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    --podName "${SPARK_EXECUTOR_POD_NAME:-$(hostname)}" \
    "$@"
fi
exec bkaudit "$@"
