#!/usr/bin/env bash
# Installs what the Java side needs: a JDK and Maven (Debian packages, only if missing), and the
# ZooKeeper server jars pinned in bklib/testing/zookeeper_dist.py, fetched from Maven Central
# into $BKAUDIT_CACHE/zookeeper/lib (checksums verified; nothing is fetched when they are there).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PY:-$here/../.venv/bin/python}"

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  echo "install_java_deps: java or mvn missing, installing Debian packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
fi

"$py" -m bklib.testing.zookeeper_dist
