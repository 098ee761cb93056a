#!/usr/bin/env bash
# Installs what the Java interop tests need: Apache BookKeeper 4.17 (bookie, client, shell,
# autorecovery) and its runtime jars from Maven Central into $BKAUDIT_CACHE/bookkeeper/lib, and
# our small Java driver (scripts/java/interop-driver) compiled into $BKAUDIT_CACHE/bookkeeper/driver.
# Idempotent: a stamp named after the pom's and the driver's hash skips work already done.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}"

if ! command -v javac >/dev/null || ! command -v mvn >/dev/null; then
  echo "install_bookkeeper: javac or mvn missing, installing Debian packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi

bk="$cache/bookkeeper"
lib="$bk/lib"
pom="$here/java/bookkeeper/pom.xml"
lib_stamp="$lib/.complete-$(sha1sum "$pom" | cut -c1-12)"
if [ ! -f "$lib_stamp" ]; then
  echo "install_bookkeeper: resolving BookKeeper jars into $lib" >&2
  rm -rf "$lib"
  mkdir -p "$lib"
  # netty-tcnative (TLS) is not used and is large; the other natives are used when they load.
  mvn -q -B -f "$pom" dependency:copy-dependencies \
    -DoutputDirectory="$lib" -DincludeScope=runtime \
    -DexcludeArtifactIds=netty-tcnative-boringssl-static
  touch "$lib_stamp"
fi

src="$here/java/interop-driver/src"
drv="$bk/driver"
drv_hash="$( (find "$src" -name '*.java' -print0 | sort -z | xargs -0 cat; cat "$lib_stamp" "$pom") | sha1sum | cut -c1-12)"
drv_stamp="$drv/.complete-$drv_hash"
if [ ! -f "$drv_stamp" ]; then
  echo "install_bookkeeper: compiling the interop driver into $drv" >&2
  rm -rf "$drv"
  mkdir -p "$drv/classes"
  find "$src" -name '*.java' -print0 | xargs -0 javac -nowarn --release 11 -cp "$lib/*" -d "$drv/classes"
  touch "$drv_stamp"
fi
