#!/usr/bin/env bash
# Builds Prometheus's promtool from its Go module (release tarballs are not reachable from
# here) into $BKAUDIT_CACHE/prometheus/<version>/promtool, once, and prints its path.
# tests/unit/test_alert_rules.py and tests/integration/test_alerts_*.py run `promtool test
# rules` on deploy/monitoring/bkaudit-alerts.yaml (docs/monitoring.md).
# The module's v0.3XX.Y versions are Prometheus 3.XX.Y: v0.316.0 is Prometheus 3.16.0.
# Built without the service-discovery plugins (Prometheus's remove_all_sd tag: the rule
# tests need none, and the cloud SDKs they pull in take most of the build).
set -euo pipefail
version=v0.316.0
bin="${BKAUDIT_CACHE:-$HOME/.cache/bkaudit}/prometheus/$version"
if [ ! -x "$bin/promtool" ]; then
  command -v go >/dev/null || { echo "install_prometheus: the Go toolchain is needed" >&2; exit 2; }
  echo "install_prometheus: building promtool $version from its Go module (minutes, once)" >&2
  GOBIN="$bin" go install -tags remove_all_sd "github.com/prometheus/prometheus/cmd/promtool@$version"
fi
echo "$bin/promtool"
