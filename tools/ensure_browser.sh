#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the real-browser test (make browser / make test).
# Installs the `chromium` package with apt-get only when /usr/bin/chromium is missing; Playwright
# (the pinned Python package) drives it and never downloads a browser of its own.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ] && "$CHROMIUM" --headless --no-sandbox --version >/dev/null 2>&1; then
    exit 0
fi

echo "Debian's chromium is missing: installing it with apt-get (about 80 s)" >&2
if [ "$(id -u)" = 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "cannot install chromium: run as root, or: sudo apt-get install -y chromium" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "cannot install chromium: no apt-get here (the browser test needs Debian's chromium at $CHROMIUM)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q chromium
"$CHROMIUM" --headless --no-sandbox --version
