#!/usr/bin/env bash
# Runs every test of budgetgate. Installs what the tests need when missing:
# redis-server, chromium + chromedriver and promtool (Debian packages), a
# Python virtualenv with the pinned openai and anthropic SDKs.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server, Debian's chromium and chromedriver (the budget page test),
# promtool (the deploy/ kit test): apt-get, each only when missing.
scripts/install-test-deps.sh

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import openai, anthropic" >/dev/null 2>&1 \
   || ! cmp -s tests/python/requirements.txt .venv/.requirements 2>/dev/null; then
    echo "creating .venv with the pinned openai and anthropic SDKs..."
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r tests/python/requirements.txt
    cp tests/python/requirements.txt .venv/.requirements
fi
export BUDGETGATE_PYTHON="$PWD/.venv/bin/python"

# --no-fail-fast: one failing test file must not hide the results of the others.
# No feature flags: every suite is compiled into a plain `cargo test`.
cargo test --all-targets --no-fail-fast "$@"
