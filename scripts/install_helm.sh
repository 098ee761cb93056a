#!/usr/bin/env bash
# Builds Helm from its Go module (release binaries are not reachable from here) into
# $BKAUDIT_CACHE/helm/<version>/helm, once; tests/deploy/test_helm_chart.py runs it.
set -euo pipefail
version=v3.22.0
bin="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}/helm/$version"
if [ ! -x "$bin/helm" ]; then
  command -v go >/dev/null || { echo "install_helm: the Go toolchain is needed" >&2; exit 2; }
  echo "install_helm: building Helm $version from its Go module (minutes, once)" >&2
  GOBIN="$bin" go install "helm.sh/helm/v3/cmd/helm@$version"
fi
echo "$bin/helm"
