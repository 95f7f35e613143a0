#!/usr/bin/env bash
# Make sure Debian's bubblewrap (`bwrap`) is installed: `make grade` runs each student's kernel in
# it (no network, a read-only system, writes only in the notebook's temporary folder). Installs the
# `bubblewrap` package with apt-get only when `bwrap` is missing; prints what to do where it cannot.
set -euo pipefail

if command -v bwrap >/dev/null; then
    exit 0
fi

echo "bubblewrap (bwrap) is missing: installing Debian's package with apt-get" >&2
if [ "$(id -u)" = 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "cannot install bubblewrap: run as root, or: sudo apt-get install -y bubblewrap" >&2
    echo "(or grade without the sandbox: GRADE_ARGS=\"--no-sandbox\", which only warns)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "cannot install bubblewrap: no apt-get here; install bubblewrap with your package manager" >&2
    echo "(or grade without the sandbox: GRADE_ARGS=\"--no-sandbox\", which only warns)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q bubblewrap
bwrap --version
