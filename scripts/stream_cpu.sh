#!/usr/bin/env bash
# The gateway's CPU per stream, user and kernel apart (issue 40): one
# gateway binary (memory store, ledger off, limits that never refuse, as
# scripts/bench.sh configures it) in front of the mock upstream, loaded
# with 64-delta chat streams by oha; the gateway's utime and stime are
# read from /proc before and after the measured run.
#
#   scripts/stream_cpu.sh                          # this build, c=16, 6 s
#   CONC=1 SECS=10 scripts/stream_cpu.sh ../base/target/release/budgetgate
#   STRACE=1 scripts/stream_cpu.sh                 # also count the gateway's
#                                                  # system calls (strace -c)
#
# Needs release binaries (`cargo build --release --bins --examples`), oha
# and, with STRACE=1, strace. Prints streams/s and the CPU per stream.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
GATEWAY=${1:-target/release/budgetgate}
MOCK=target/release/examples/mock_upstream
CONC=${CONC:-16}
SECS=${SECS:-6}
command -v oha >/dev/null || { echo "oha is required (cargo install oha --locked)" >&2; exit 1; }
TMP=$(mktemp -d -t budgetgate-stream-cpu.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

# The address a process prints as "<prefix> http://<addr>" once it listens.
listening() { # $1 log, $2 prefix, $3 pid
    for _ in $(seq 1 200); do
        if grep -q "^$2 http://" "$1" 2>/dev/null; then
            grep -m1 "^$2 http://" "$1" | sed "s|^$2 http://||"
            return 0
        fi
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

"$MOCK" --listen 127.0.0.1:0 >"$TMP/mock.out" 2>&1 &
PIDS+=($!)
MOCK_ADDR=$(listening "$TMP/mock.out" "mock_upstream listening on" "$!")
KEY="sk-stream-cpu-$$"
KEY_SHA=$(printf '%s' "$KEY" | sha256sum | cut -d' ' -f1)
cat >"$TMP/gw.toml" <<EOF
[server]
listen = "127.0.0.1:0"
[control]
database_url = "sqlite://$TMP/control.db"
[ledger]
enabled = false
[store]
kind = "memory"
[[upstreams]]
name = "mock"
kind = "self_hosted"
base_url = "http://$MOCK_ADDR/v1"
limits = { rpm = 50000000, tpm = 50000000, max_concurrent = 100000 }
[[models]]
name = "gpt-4o-mini"
upstreams = ["mock"]
encoding = "o200k_base"
default_max_output_tokens = 256
max_output_tokens = 16384
[[tenants]]
name = "bench"
keys = [{ id = "bench", sha256 = "$KEY_SHA" }]
limits = { rpm = 50000000, tpm = 50000000, max_concurrent = 100000, tokens_per_day = 50000000000 }
on_store_error = "fail_closed"
EOF
mkdir -p "$TMP/state"
RUST_LOG=warn STATE_DIRECTORY="$TMP/state" "$GATEWAY" serve --config "$TMP/gw.toml" >"$TMP/gw.out" 2>&1 &
GW=$!
PIDS+=("$GW")
GW_ADDR=$(listening "$TMP/gw.out" "budgetgate listening on" "$GW")

BODY='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64,"stream":true}'
load() { # $1 duration
    oha --no-tui -z "$1" -c "$CONC" -m POST -H "Authorization: Bearer $KEY" \
        -H 'content-type: application/json' -d "$BODY" "http://$GW_ADDR/v1/chat/completions"
}
load 1s >/dev/null 2>&1 # warm-up
if [[ ${STRACE:-0} == 1 ]]; then
    strace -c -f -p "$GW" -o "$TMP/strace.txt" 2>/dev/null &
    ST=$!
    sleep 0.5
fi
ticks() { awk '{ print $14, $15 }' "/proc/$GW/stat"; }
read -r U0 S0 < <(ticks)
load "${SECS}s" >"$TMP/oha.txt" 2>&1
read -r U1 S1 < <(ticks)
RPS=$(awk '/Requests\/sec/ { print $2; exit }' "$TMP/oha.txt")
HZ=$(getconf CLK_TCK)
awk -v rps="$RPS" -v secs="$SECS" -v u=$((U1 - U0)) -v s=$((S1 - S0)) -v hz="$HZ" -v c="$CONC" 'BEGIN {
    n = rps * secs
    printf "c=%d: %.0f streams/s; gateway CPU per stream: user %.0f us, kernel %.0f us\n", c, rps, u / hz / n * 1e6, s / hz / n * 1e6
}'
if [[ ${STRACE:-0} == 1 ]]; then
    kill -INT "$ST" 2>/dev/null || true
    wait "$ST" 2>/dev/null || true
    echo "system calls of the gateway over the run (strace -c; strace slows it down):"
    head -12 "$TMP/strace.txt"
fi
