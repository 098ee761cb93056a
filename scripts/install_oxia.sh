#!/usr/bin/env bash
# Builds the Oxia server (github.com/oxia-db/oxia, the metadata store Pulsar runs BookKeeper on
# since PIP-335) from its Go module into $BKAUDIT_CACHE/oxia/<version>/oxia, once, and prints
# its path. `go install …@version` is refused by the module proxy here (it asks for a version
# list the proxy does not serve), so a throw-away module requires the pinned version and
# builds its `cmd` package. bklib/testing/oxiaserver.py runs the binary.
set -euo pipefail
version=v0.14.0
dir="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}/oxia/$version"
if [ ! -x "$dir/oxia" ]; then
  command -v go >/dev/null || { echo "install_oxia: the Go toolchain is needed" >&2; exit 2; }
  echo "install_oxia: building Oxia $version from its Go module (minutes, once)" >&2
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  (
    cd "$work"
    go mod init bkaudit.local/oxia-build >/dev/null 2>&1
    go get "github.com/oxia-db/oxia/cmd@$version" >/dev/null 2>&1
    mkdir -p "$dir"
    go build -o "$dir/oxia.tmp" github.com/oxia-db/oxia/cmd
  )
  mv "$dir/oxia.tmp" "$dir/oxia"
fi
echo "$dir/oxia"
