#!/usr/bin/env bash
# Installs what the Pulsar harness (tests/pulsar) needs: an Apache Pulsar broker $PULSAR_VERSION
# (org.apache.pulsar:pulsar-broker; default the newest 4.0.x on Maven Central) and its runtime
# jars into $BKAUDIT_CACHE/pulsar/$PULSAR_VERSION/lib. The same classpath runs
# PulsarBrokerStarter, PulsarClusterMetadataSetup and a Java bookie
# (org.apache.bookkeeper.server.Main, at the BookKeeper version Pulsar pins) on either metadata
# driver: BookKeeper's zk+hierarchical:// or Pulsar's metadata-store:zk: (pulsar-metadata).
# Prints the classpath last on stdout.
# Idempotent: a stamp named after the version and the pom's hash skips work done.
#   PULSAR_VERSION=4.0.7 scripts/install_pulsar.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}"
# The default; tests/pulsar/harness.py (PULSAR_VERSION) names the same one.
version="${PULSAR_VERSION:-4.0.7}"
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "install_pulsar: PULSAR_VERSION must look like 4.0.7, got '$version'" >&2
  exit 2
fi

if ! command -v javac >/dev/null || ! command -v mvn >/dev/null; then
  echo "install_pulsar: javac or mvn missing, installing Debian packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi

home="$cache/pulsar/$version"
lib="$home/lib"
pom="$here/java/pulsar/pom.xml"
# netty-tcnative (TLS through BoringSSL, one jar per platform) is not used and is large; Netty
# falls back to the JDK's TLS. The other natives are used when they load.
excludes=netty-tcnative-boringssl-static
stamp_name=".complete-$( (echo "$version $excludes"; cat "$pom") | sha1sum | cut -c1-12)"
if [ ! -f "$lib/$stamp_name" ]; then
  echo "install_pulsar: resolving Apache Pulsar $version jars into $lib" >&2
  mkdir -p "$home"
  # Resolve into a fresh directory, moved into place once complete: an interrupted or failed
  # run leaves no half-filled lib behind.
  tmp="$(mktemp -d "$home/lib-tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  chmod 755 "$tmp"
  # Maven's output goes to stderr: even with -q it writes colour codes to stdout, whose last line
  # must be the classpath alone.
  mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
    -Dpulsar.version="$version" -DoutputDirectory="$tmp" -DincludeScope=runtime \
    -DexcludeArtifactIds="$excludes" >&2
  for jar in "pulsar-broker-$version.jar" "pulsar-metadata-$version.jar"; do
    if [ ! -f "$tmp/$jar" ]; then
      echo "install_pulsar: $jar was not resolved" >&2
      exit 1
    fi
  done
  if ! ls "$tmp"/bookkeeper-server-*.jar >/dev/null 2>&1; then
    echo "install_pulsar: bookkeeper-server was not resolved" >&2
    exit 1
  fi
  touch "$tmp/$stamp_name"
  rm -rf "$lib"
  mv -T "$tmp" "$lib"
fi
# The classpath, on stdout (tests/pulsar/harness.py reads it).
echo "$lib/*"
