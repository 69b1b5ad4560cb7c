#!/usr/bin/env bash
# Headless Chromium for the HTML report's browser test (tests/test_htmlreport.py), best effort:
# Debian's chromium package where apt works as root; otherwise that one test skips and says why.
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # bounded: a CI host whose package mirrors cannot be reached must not hang here
  timeout 300 apt-get install -y -q chromium >/dev/null 2>&1 \
    || { timeout 180 apt-get update -q >/dev/null 2>&1 && timeout 300 apt-get install -y -q chromium >/dev/null 2>&1; } \
    || echo "scripts/browser.sh: could not install chromium; the HTML report's browser test will skip"
else
  echo "scripts/browser.sh: no chromium (install Debian's chromium package); the HTML report's browser test will skip"
fi
exit 0
