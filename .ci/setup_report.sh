#!/usr/bin/env bash
# CI setup for the HTML run report's browser test (idempotent): Debian's chromium, driven
# headless over the DevTools protocol by tests/report (no browser download, no network at
# test time). Run as root. The test finds the browser via $CHROMIUM or `chromium` on PATH.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

echo "== report: Debian package (chromium)"
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
# Debian's /usr/bin/chromium wrapper prints a harmless shell warning; ask the real binary
if [ -x /usr/lib/chromium/chromium ]; then /usr/lib/chromium/chromium --version; else chromium --version; fi
