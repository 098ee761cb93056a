#!/usr/bin/env bash
# Builds the Oxia server (github.com/oxia-db/oxia, the metadata store Pulsar runs BookKeeper on
# since PIP-335) from its Go module into $BKAUDIT_CACHE/oxia/<build>/oxia, once, and prints
# its path. bklib/testing/oxiaserver.py runs the binary.
#
# The module proxy here serves v0.14.0 of the single-module releases, and v0.14.0 has a
# regression that Oxia fixed in v0.14.4 ("fix the concurrent write causes disordered offset",
# oxia-db/oxia#738): the leader releases its lock between taking a WAL offset and appending
# it, so two concurrent writes to one shard can reach the WAL out of order, and from then on
# every write to that shard fails ("N can not immediately follow M"). A bookie's session
# expiring while an audit writes is enough. So the source is downloaded through the proxy
# and built with the lock held until the append is issued, as v0.14.4 does. `go install
# ...@version` is refused by the proxy (it asks for a version list it does not serve).
set -euo pipefail
version=v0.14.0
build="$version-bkaudit1"
dir="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}/oxia/$build"
if [ ! -x "$dir/oxia" ]; then
  command -v go >/dev/null || { echo "install_oxia: the Go toolchain is needed" >&2; exit 2; }
  echo "install_oxia: building Oxia $build from its Go module (minutes, once)" >&2
  work="$(mktemp -d)"
  trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
  (
    cd "$work"
    go mod init bkaudit.local/oxia-build >/dev/null 2>&1
    src="$(go mod download -json "github.com/oxia-db/oxia@$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
    [ -d "$src" ] || { echo "install_oxia: cannot download oxia $version" >&2; exit 2; }
    cp -r "$src" "$work/src"
    chmod -R u+w "$work/src"
    file="$work/src/server/leader_controller.go"
    # Keep the leader's lock from taking the offset until the WAL append is issued.
    perl -0pi -e 's/\tterm := lc\.term\n\tlc\.Unlock\(\)\n\trequest := requestSupplier\(newOffset\)/\tterm := lc.term\n\trequest := requestSupplier(newOffset)/ or die "patch 1"' "$file"
    perl -0pi -e 's/(value, err := logEntryValue\.MarshalVT\(\)\n\tif err != nil \{\n)(\t\tcb\.OnCompleteError\(err\))/$1\t\tlc.Unlock()\n$2/ or die "patch 2"' "$file"
    perl -0pi -e 's/\n\twalLog\.AppendAndSync\(&proto\.LogEntry\{/\n\tdefer lc.Unlock()\n\twalLog.AppendAndSync(&proto.LogEntry{/ or die "patch 3"' "$file"
    mkdir -p "$dir"
    cd "$work/src"
    go build -o "$dir/oxia.tmp" ./cmd
  )
  mv "$dir/oxia.tmp" "$dir/oxia"
fi
echo "$dir/oxia"
