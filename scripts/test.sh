#!/usr/bin/env bash
# Runs every test of budgetgate. Installs what the tests need when missing:
# redis-server (Debian package), a Python virtualenv with the pinned openai SDK.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "installing redis-server (tests start their own on free ports)..."
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
    else
        echo "redis-server is missing and apt-get is unavailable; install Redis 7 and retry" >&2
        exit 1
    fi
fi

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import openai" >/dev/null 2>&1 \
   || ! cmp -s tests/python/requirements.txt .venv/.requirements 2>/dev/null; then
    echo "creating .venv with the pinned openai SDK..."
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r tests/python/requirements.txt
    cp tests/python/requirements.txt .venv/.requirements
fi
export BUDGETGATE_PYTHON="$PWD/.venv/bin/python"

# --no-fail-fast: one failing test file must not hide the results of the others.
cargo test --all-features --all-targets --no-fail-fast "$@"
