#!/usr/bin/env bash
# A soak you can rerun (not in CI): the gateway on a Redis store of its own,
# the simulated upstream, and MINUTES of mixed loopback load
# (scripts/soak_load.py: streamed and whole answers, embeddings, streams the
# client abandons, a tenant whose tight limits refuse most requests).
# Prints the gateway's RSS over time and, after the load, the live holds and
# the held concurrency slots left in the store: both must return to zero
# (exit 1 otherwise).
#
#   scripts/soak.sh MINUTES          # debug binaries (PROFILE=release for release ones)
#   WORKERS=16 scripts/soak.sh 10
#
# Needs redis-server and redis-cli, and Python with httpx (the test venv:
# .venv, or BUDGETGATE_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${1:?usage: scripts/soak.sh MINUTES}
profile=${PROFILE:-debug}
workers=${WORKERS:-16}
python=${BUDGETGATE_PYTHON:-.venv/bin/python}
seconds=$(( minutes * 60 ))
interval=$(( seconds / 20 )); [ "$interval" -ge 5 ] || interval=5

flag=(); [ "$profile" = release ] && flag=(--release)
cargo build "${flag[@]}" --bin budgetgate --example mock_upstream >/dev/null
bin=target/$profile

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # file pattern
    for _ in $(seq 1 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "soak: $1 never said '$2'" >&2; cat "$1" >&2; exit 1
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
wait_for "$work/redis.log" "Ready to accept connections"

mock_port=$(free_port)
"$bin/examples/mock_upstream" --listen "127.0.0.1:$mock_port" --token-delay-ms 5 --output-tokens 48 >"$work/mock.log" 2>&1 &
pids+=($!)
wait_for "$work/mock.log" "listening"

key=sk-soak-main
small=sk-soak-small
sha() { printf '%s' "$1" | "$bin/budgetgate" hash-key; }
gw_port=$(free_port)
cat >"$work/soak.toml" <<TOML
[server]
listen = "127.0.0.1:$gw_port"
max_request_secs = 60
settle_retry_secs = 10
slot_lease_secs = 10
[store]
kind = "redis"
# Debug binaries on a busy machine: the 50 ms default would time out often.
timeout_ms = 250
url = "redis://127.0.0.1:$redis_port/0"
[[upstreams]]
name = "mock"
kind = "self_hosted"
base_url = "http://127.0.0.1:$mock_port/v1"
limits = { max_concurrent = 64 }
[[models]]
name = "gpt-4o-mini"
upstreams = ["mock"]
default_max_output_tokens = 64
max_output_tokens = 256
[[models]]
name = "text-embedding-3-small"
upstreams = ["mock"]
encoding = "cl100k_base"
[[tenants]]
name = "main"
keys = [{ id = "k1", sha256 = "$(sha $key)" }]
limits = { rpm = 1000000, tpm = 50000000, max_concurrent = 48 }
[[tenants]]
name = "small"
keys = [{ id = "k1", sha256 = "$(sha $small)" }]
limits = { rpm = 30, tpm = 3000, max_concurrent = 2, tokens_per_day = 40000000 }
TOML
# A state directory of its own: the default one may be held by a gateway the user runs.
mkdir -p "$work/state"
STATE_DIRECTORY="$work/state" RUST_LOG=warn "$bin/budgetgate" serve --config "$work/soak.toml" >"$work/gateway.log" 2>&1 &
gw=$!
pids+=($gw)
wait_for "$work/gateway.log" "listening"

rss() { awk '/VmRSS/ {print $2}' "/proc/$gw/status"; }
echo "soak: $minutes min, $workers workers, $profile binaries; gateway pid $gw"
echo "time_s rss_kib"
echo "0 $(rss)"
(
    t=0
    while sleep "$interval"; do t=$(( t + interval )); echo "$t $(rss)"; done
) &
sampler=$!
pids+=($sampler)

BASE_URL="http://127.0.0.1:$gw_port/v1" KEY=$key SMALL_KEY=$small DURATION=$seconds \
    WORKERS=$workers INTERVAL=$seconds "$python" scripts/soak_load.py >"$work/load.log"
kill "$sampler" 2>/dev/null || true
echo "end $(rss)"
echo "load: $(tail -1 "$work/load.log")"

# Everything the load started has ended; settlements run in the background.
# Counted in the store, against Redis TIME: live holds (a hold's value starts
# with its state, '0 ' live or '1 ' settled, then its expiry in µs; see
# lua/lib.lua) and held slots (members of the max_concurrent sets whose
# lease has not expired). A hold the gateway lost track of (a reserve whose
# reply timed out) is not settled: it frees its slots when its lease ends
# and its tokens when it expires (max_request_secs + settle_retry_secs).
cli=(redis-cli -p "$redis_port")
count_held() {
    "${cli[@]}" eval "
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local holds, slots, cursor = 0, 0, '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', '*:hold:*', 'COUNT', 1000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    local v = redis.call('GET', k)
    if v and string.sub(v, 1, 2) == '0 ' then
      local exp = tonumber(string.match(v, '^0 (%d+)'))
      if exp and exp > now then holds = holds + 1 end
    end
  end
until cursor == '0'
cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', '*max_concurrent*', 'COUNT', 1000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    if redis.call('TYPE', k)['ok'] == 'zset' then
      slots = slots + redis.call('ZCOUNT', k, '(' .. now, '+inf')
    end
  end
until cursor == '0'
return holds .. ' ' .. slots" 0
}
sleep 2
echo "after_load_s live_holds held_slots"
waited=0
read -r holds slots < <(count_held)
echo "$waited $holds $slots"
first_holds=$holds; first_slots=$slots
while [ "$holds" -ne 0 ] || [ "$slots" -ne 0 ]; do
    [ "$waited" -lt 90 ] || break
    sleep 5; waited=$(( waited + 5 ))
    read -r holds slots < <(count_held)
    echo "$waited $holds $slots"
done
echo "live holds: $first_holds right after the load, $holds at the end"
echo "held slots: $first_slots right after the load, $slots at the end"
echo "reserve replies lost (store timeouts that failed open): $(grep -c 'failing open' "$work/gateway.log" || true)"
echo "gateway warnings/errors: $(grep -c -E 'WARN|ERROR' "$work/gateway.log" || true)"
grep -E 'WARN|ERROR' "$work/gateway.log" | sed -E 's/\x1b\[[0-9;]*m//g' | sort | uniq -c | sort -rn | head -5 | cut -c1-300 || true
[ "$holds" -eq 0 ] && [ "$slots" -eq 0 ]
