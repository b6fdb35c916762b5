#!/usr/bin/env bash
# The gateway's RSS for many distinct end users, quota leases on and off
# (the lease book once kept an entry per end user ever seen).
# For each mode: a gateway on a Redis of its own and the simulated
# upstream, USERS requests each naming a new end user (a tenant with
# end_user_limits), then IDLE seconds without traffic (the book sweeps
# every 10 s). Prints RSS before the load, after it, and after the idle.
# Figures go to docs/PERFORMANCE.md; nothing is asserted.
#
#   scripts/lease_book_rss.sh                 # 200,000 end users, release binaries
#   PROFILE=debug USERS=20000 scripts/lease_book_rss.sh   # a sanity run
#   MODES="on" scripts/lease_book_rss.sh      # one mode only
#
# Needs release binaries (`cargo build --release --bin budgetgate --example
# mock_upstream`) unless PROFILE=debug, redis-server, and Python with httpx
# (the test venv: .venv, or BUDGETGATE_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${PROFILE:-release}
users=${USERS:-200000}
idle=${IDLE:-25}
workers=${WORKERS:-32}
modes=${MODES:-on off}
python=${BUDGETGATE_PYTHON:-.venv/bin/python}
bin=target/$profile
for b in "$bin/budgetgate" "$bin/examples/mock_upstream"; do
    [ -x "$b" ] || { echo "lease_book_rss: $b missing (build it: cargo build ${profile/debug/} --bin budgetgate --example mock_upstream)" >&2; exit 2; }
done

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # file pattern
    for _ in $(seq 1 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "lease_book_rss: $1 never said '$2'" >&2; cat "$1" >&2; exit 1
}

mock_port=$(free_port)
"$bin/examples/mock_upstream" --listen "127.0.0.1:$mock_port" --output-tokens 8 >"$work/mock.log" 2>&1 &
pids+=($!)
wait_for "$work/mock.log" "listening"

key=sk-rss-0123456789
sha=$(printf '%s' "$key" | "$bin/budgetgate" hash-key)
echo "lease_book_rss: $users end users, $profile binaries, idle $idle s"
echo "mode rss_kib_start rss_kib_loaded rss_kib_idle"
for mode in $modes; do
    dir="$work/$mode"
    mkdir -p "$dir"
    redis_port=$(free_port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
    redis=$!
    pids+=($redis)
    wait_for "$dir/redis.log" "Ready to accept connections"
    gw_port=$(free_port)
    # min_rate 1: every end user's budgets enter the book (and a few
    # lease), the worst case for its size.
    cat >"$dir/gw.toml" <<TOML
[server]
listen = "127.0.0.1:$gw_port"
end_user_key_env = "RSS_END_USER_KEY"
[store]
kind = "redis"
timeout_ms = 1000
url = "redis://127.0.0.1:$redis_port/0"
[store.lease]
mode = "$( [ "$mode" = on ] && echo auto || echo off )"
min_rate = 1
[[upstreams]]
name = "mock"
kind = "self_hosted"
base_url = "http://127.0.0.1:$mock_port/v1"
[[models]]
name = "gpt-4o-mini"
upstreams = ["mock"]
default_max_output_tokens = 16
[[tenants]]
name = "t"
keys = [{ id = "k1", sha256 = "$sha" }]
limits = { rpm = 100000000, tpm = 10000000000 }
end_user_limits = { rpm = 600, tpm = 100000, tokens_per_day = 10000000 }
TOML
    RSS_END_USER_KEY=rss-end-user-key-0123456789 RUST_LOG=warn STATE_DIRECTORY="$dir" \
        "$bin/budgetgate" serve --config "$dir/gw.toml" >"$dir/gateway.log" 2>&1 &
    gw=$!
    pids+=($gw)
    wait_for "$dir/gateway.log" "listening"
    rss() { awk '/VmRSS/ {print $2}' "/proc/$gw/status"; }
    start=$(rss)
    BASE_URL="http://127.0.0.1:$gw_port/v1" KEY=$key USERS=$users WORKERS=$workers \
        "$python" - >"$dir/load.log" <<'PY'
import asyncio, os
try:
    import httpx
except ImportError:
    import httpx2 as httpx
base, key = os.environ["BASE_URL"], os.environ["KEY"]
users, workers = int(os.environ["USERS"]), int(os.environ["WORKERS"])
codes = {}
async def worker(client, ids):
    for i in ids:
        body = {"model": "gpt-4o-mini", "user": f"user-{i}",
                "messages": [{"role": "user", "content": "hi"}]}
        try:
            r = await client.post(f"{base}/chat/completions", json=body,
                                  headers={"authorization": f"Bearer {key}"})
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
        except httpx.HTTPError as e:
            codes[type(e).__name__] = codes.get(type(e).__name__, 0) + 1
async def main():
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client, range(w, users, workers)) for w in range(workers)))
    print(codes)
asyncio.run(main())
PY
    loaded=$(rss)
    sleep "$idle"
    echo "$mode $start $loaded $(rss)  (answers: $(tail -1 "$dir/load.log"))"
    kill "$gw" "$redis" 2>/dev/null || true
    wait "$gw" "$redis" 2>/dev/null || true
done
