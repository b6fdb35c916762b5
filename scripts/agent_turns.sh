#!/usr/bin/env bash
# The agent-turns benchmark (expected-output reservation): 4 agents x 200 turns of
# each recorded CLI version's default body (tests/fixtures/agent_turns/,
# listed in recorded.json; record the pinned CLIs' with AGENT_TURNS_RECORD=1
# cargo test --test it agents_cli::) with outputs in order from
# tests/fixtures/agent_turns/output_sizes.txt (scripts/output_sizes.py), in
# "expected" and "cap" mode, under a quota the exposure cap does not bind.
# Prints reserved / settled tokens, turns past their reservation, debt and
# peak exposure per mode, then the smallest tenant tpm without a 429 per
# mode (bisection over runs of 4 agents starting one turn each a minute);
# nothing is asserted, no timing is a criterion.
#   scripts/agent_turns.sh            # 200 turns per agent, 50 minutes per tpm run
#   AGENT_TURNS=50 AGENT_TURNS_TPM_ROUNDS=10 scripts/agent_turns.sh
#   RELEASE=1 scripts/agent_turns.sh  # a release build (same figures, faster)
#   AGENT_TURNS_ONLY=claude-code@2.1.332 scripts/agent_turns.sh  # one recording (its label contains this)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test ${RELEASE:+--release} --test it expected_output::agent_turns_benchmark -- --ignored --nocapture 2>&1 |
    grep -E '^agent_turns|test result'
