#!/usr/bin/env bash
# Headless Chromium for the HTML report test (tests/report/test_html_report_browser.py).
# Debian's package; no-op when /usr/bin/chromium already exists.
set -euo pipefail
if [[ -x /usr/bin/chromium ]]; then
  exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version
