#!/usr/bin/env bash
# Installs what the Java side needs: a JDK and Maven (Debian packages, only if missing), and the
# ZooKeeper server jars from Maven Central into $BKAUDIT_CACHE/zookeeper/lib.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}"

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  echo "install_java_deps: java or mvn missing, installing Debian packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
fi

zk_lib="$cache/zookeeper/lib"
stamp="$zk_lib/.complete-$(sha1sum "$here/java/zookeeper/pom.xml" | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "install_java_deps: resolving ZooKeeper server jars into $zk_lib" >&2
  rm -rf "$zk_lib"
  mkdir -p "$zk_lib"
  mvn -q -B -f "$here/java/zookeeper/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$zk_lib" -DincludeScope=runtime -DexcludeArtifactIds=netty-tcnative-boringssl-static
  touch "$stamp"
fi
