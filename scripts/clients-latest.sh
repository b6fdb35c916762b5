#!/usr/bin/env bash
# The newest clients against the gateway on the shipped configs: installs
# the newest published coding-agent CLIs (@openai/codex,
# @anthropic-ai/claude-code, opencode-ai) and SDKs (npm openai and
# @anthropic-ai/sdk; PyPI openai, anthropic, openai-agents,
# langchain-openai) into a temporary prefix, prints their versions, then
# runs scripts/clients_latest.py: per client, say hi, a streamed turn, a
# rate refusal retried, a quota refusal that stops at once, a cutoff, an
# agent with a function tool, a non-streamed uncapped answer, against the
# debug gateway and the simulated upstream. Prints a table client ×
# version × case → pass/fail with the request that failed; exits 1 when a
# case failed. Not part of CI: it depends on what was published that day
# (docs/AGENTS.md, "Newest clients", has the last run).
#   scripts/clients-latest.sh
#   KEEP=1 scripts/clients-latest.sh        # keep the prefix (printed)
#   PREFIX=/tmp/x scripts/clients-latest.sh # reuse an earlier prefix's installs
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x target/debug/budgetgate ] || [ ! -x target/debug/examples/mock_upstream ]; then
    cargo build --bin budgetgate --example mock_upstream
fi

prefix=${PREFIX:-$(mktemp -d /tmp/clients-latest.XXXXXX)}
if [ -z "${PREFIX:-}" ] && [ -z "${KEEP:-}" ]; then
    trap 'rm -rf "$prefix"' EXIT
fi
echo "prefix: $prefix"

if [ ! -d "$prefix/npm/node_modules" ]; then
    mkdir -p "$prefix/npm"
    echo '{"private": true}' >"$prefix/npm/package.json"
    (cd "$prefix/npm" && npm install --include=optional --no-audit --no-fund --loglevel=error \
        @openai/codex@latest @anthropic-ai/claude-code@latest opencode-ai@latest \
        openai@latest @anthropic-ai/sdk@latest >/dev/null)
fi
if [ ! -x "$prefix/venv/bin/python" ]; then
    python3 -m venv "$prefix/venv"
    "$prefix/venv/bin/pip" install -q --disable-pip-version-check --upgrade \
        openai anthropic openai-agents langchain-openai tomli-w
fi

echo "installed:"
(cd "$prefix/npm" && npm ls --depth=0 2>/dev/null | tail -n +2)
"$prefix/venv/bin/pip" list --disable-pip-version-check 2>/dev/null |
    grep -iE '^(openai|anthropic|openai-agents|langchain-openai) '
t0=$SECONDS
status=0
CLIENTS_PREFIX="$prefix" "$prefix/venv/bin/python" scripts/clients_latest.py || status=$?
echo "checks took $((SECONDS - t0)) s"
exit "$status"
