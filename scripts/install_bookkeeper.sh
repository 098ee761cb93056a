#!/usr/bin/env bash
# Installs what the Java interop tests need: Apache BookKeeper $BK_VERSION (bookie, client, shell,
# autorecovery; default the newest 4.17, any 4.16.x / 4.17.x / 4.18.x on Maven Central works) and
# its runtime jars into $BKAUDIT_CACHE/bookkeeper/$BK_VERSION/lib, and our small Java driver
# (scripts/java/interop-driver) plus the metadata tool (scripts/java/metadata-tool) compiled
# against them into $BKAUDIT_CACHE/bookkeeper/$BK_VERSION/driver/<hash>. Prints the classpath.
# Idempotent: a stamp named after the version, the pom's and the sources' hash skips work done.
#   BK_VERSION=4.18.2 scripts/install_bookkeeper.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}"
# The default; tests/interop/harness.py (BK_VERSION) names the same one.
version="${BK_VERSION:-4.17.3}"
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "install_bookkeeper: BK_VERSION must look like 4.17.3, got '$version'" >&2
  exit 2
fi

if ! command -v javac >/dev/null || ! command -v mvn >/dev/null; then
  echo "install_bookkeeper: javac or mvn missing, installing Debian packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi

bk="$cache/bookkeeper/$version"
lib="$bk/lib"
pom="$here/java/bookkeeper/pom.xml"
lib_stamp="$lib/.complete-$( (echo "$version"; cat "$pom") | sha1sum | cut -c1-12)"
if [ ! -f "$lib_stamp" ]; then
  echo "install_bookkeeper: resolving BookKeeper $version jars into $lib" >&2
  rm -rf "$lib"
  mkdir -p "$lib"
  # netty-tcnative (TLS) is not used and is large; the other natives are used when they load.
  mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -Dbk.version="$version" \
    -DoutputDirectory="$lib" -DincludeScope=runtime \
    -DexcludeArtifactIds=netty-tcnative-boringssl-static >&2
  if [ ! -f "$lib/bookkeeper-server-$version.jar" ]; then
    echo "install_bookkeeper: bookkeeper-server-$version.jar was not resolved" >&2
    exit 1
  fi
  touch "$lib_stamp"
fi

srcs=("$here/java/interop-driver/src" "$here/java/metadata-tool/src")
drv_hash="$( (find "${srcs[@]}" -name '*.java' -print0 | sort -z | xargs -0 cat; echo "$lib_stamp"; cat "$pom") | sha1sum | cut -c1-12)"
# One directory per source hash, never rewritten in place: a JVM of a concurrent test run keeps
# the classes it started with while another run compiles changed sources next to them.
drv="$bk/driver/$drv_hash"
if [ ! -f "$drv/.complete" ]; then
  echo "install_bookkeeper: compiling the interop driver against $version into $drv" >&2
  tmp="$(mktemp -d "$bk/driver-tmp.XXXXXX")"
  mkdir -p "$tmp/classes"
  # --release 17: BookKeeper 4.18 is built for Java 17 (javac --release 11 cannot read its
  # class files); 4.16 and 4.17 are Java 8/11 class files, which 17 reads too.
  find "${srcs[@]}" -name '*.java' -print0 | xargs -0 javac -nowarn --release 17 -cp "$lib/*" -d "$tmp/classes"
  touch "$tmp/.complete"
  mkdir -p "$bk/driver"
  # A concurrent run may have finished the same hash first: keep theirs.
  mv -T "$tmp" "$drv" 2>/dev/null || rm -rf "$tmp"
  # Keep the five newest builds (old ones may still be in use by a running JVM).
  ls -1dt "$bk/driver"/*/ 2>/dev/null | tail -n +6 | xargs -r rm -rf
fi
# The classpath, on stdout (tests/interop/harness.py reads it).
echo "$drv/classes:$lib/*"
