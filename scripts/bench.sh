#!/usr/bin/env bash
# End-to-end benchmark (docs/PERFORMANCE.md): the simulated upstream driven directly,
# through a bare reverse proxy (the forwarding floor) and through
# budgetgate (memory store; Redis store), in one run, on 127.0.0.1.
#
#   scripts/bench.sh                 # ~5 minutes: 10 s per point after a 2 s warm-up
#   QUICK=1 scripts/bench.sh         # ~1 minute: 2 s per point after a 0.5 s warm-up
#
# Environment:
#   QUICK=1           short run
#   DURATION=10s      measured time per point (overrides QUICK)
#   WARMUP=2s         warm-up per point (overrides QUICK)
#   CONCURRENCY="1 16 64"
#   MODES="nonstream stream"  (add `agent` for agent turns: a Codex turn
#                     grown to ~30k input tokens by examples/agent_replay,
#                     ~160 KB, streamed to /v1/responses, the same body to
#                     every target; AGENT_TURN names another of its turns)
#   REDIS=0           skip the Redis-store gateway
#   BASELINE=path     also run this budgetgate binary (memory store) as
#                     target gw-base: another version measured in the same run
#   FLOOR=0           skip the forwarding floor: nginx (Debian's nginx-light,
#                     installed with apt-get when missing) proxying to the same
#                     mock with keepalive connections to it, no budgets, stream
#                     buffering off, as many workers as the gateway has threads
#   LEASE=off         the Redis-store gateway without quota leases (one store
#                     call per request; default: leases on, as the Redis store runs)
#   LEDGER=on         keep the spend ledger on (default off here: each gateway
#                     writes its own SQLite file in the temp dir; the ledger's
#                     own cost is measured by scripts/instructions.sh)
#   NO_BUILD=1        use the release binaries already built
#   RUST_LOG=warn     gateway log filter (default warn: no per-request log lines)
#   STREAMS=1000      concurrent streams of the memory phase (0 skips it)
#   COLD=1            run the cold-400-KB-body isolation phase (0 skips it)
#   PIN=1             the gateways on CPU 1, everything else (load generator,
#                     upstreams, redis-server) on CPU 0 (taskset): the gateway
#                     then has a core to itself, as in a deployment, instead
#                     of competing with the load generator for both; the
#                     direct target runs on CPU 0 alike (default: unpinned)
#
# Prints one table (target, mode, concurrency, RPS, p50, p99, added p50/p99
# versus the direct upstream at the same point, gateway RPS / direct RPS,
# the same two figures as ratios to the floor's (RPS / floor RPS, added p50
# / the floor's added p50), non-2xx responses) and the gateways' idle and
# peak RSS, and each gateway's user and kernel CPU per request over each
# measured run; then two phases:
# STREAMS concurrent streams held open by a slow upstream (peak RSS with
# that many streams in flight), and small requests beside a stream of
# never-seen 400 KB prompts (their p99 with and without). The three targets
# of one point run back to back, so ratios compare neighbours. Needs: cargo,
# jq, oha (installed with `cargo install oha --locked` when missing),
# redis-server (for the Redis target).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PATH="$HOME/.cargo/bin:$PATH"

if [[ "${QUICK:-0}" == 1 ]]; then
    DURATION=${DURATION:-2s}
    WARMUP=${WARMUP:-0.5s}
else
    DURATION=${DURATION:-10s}
    WARMUP=${WARMUP:-2s}
fi
CONCURRENCY=${CONCURRENCY:-"1 16 64"}
MODES=${MODES:-"nonstream stream"}
export RUST_LOG=${RUST_LOG:-warn}

TMP=$(mktemp -d /tmp/budgetgate-bench.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]:-}"; do
        [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]:-}"; do
        [[ -n "$pid" ]] && wait "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "bench: $*" >&2; }
die() { say "$*"; exit 1; }

command -v jq >/dev/null || die "jq is required (apt-get install -y jq)"

# --- binaries ---------------------------------------------------------------
if [[ "${NO_BUILD:-0}" != 1 ]]; then
    say "building release binaries (cargo build --release --bins --examples)"
    cargo build --release --bins --examples >&2
fi
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | jq -r .target_directory)
GATEWAY="$TARGET_DIR/release/budgetgate"
MOCK="$TARGET_DIR/release/examples/mock_upstream"
[[ -x "$GATEWAY" && -x "$MOCK" ]] || die "release binaries missing under $TARGET_DIR/release"

if ! oha --version >/dev/null 2>&1; then
    say "oha not found: installing it with 'cargo install oha --locked' (a release build, several minutes)"
    cargo install oha --locked >&2
fi
say "load generator: $(oha --version)"
if oha --help 2>/dev/null | grep -q -- '--output-format'; then
    OHA_JSON=(--output-format json)
else
    OHA_JSON=(-j)
fi
OHA_EXTRA=()
if oha --help 2>/dev/null | grep -q -- '--no-tui'; then
    OHA_EXTRA+=(--no-tui)
fi

# --- helpers ----------------------------------------------------------------
# Waits for "<prefix>http://ADDR" in a log file; prints ADDR.
wait_listening() {
    local log=$1 prefix=$2 pid=$3 i
    for i in $(seq 1 200); do
        if grep -q "^$prefix http://" "$log" 2>/dev/null; then
            grep -m1 "^$prefix http://" "$log" | sed "s|^$prefix http://||"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 40000))
        if port_free "$p"; then echo "$p"; return 0; fi
    done
    return 1
}

rss_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# --- servers ----------------------------------------------------------------
ON_GW=() ON_REST=()
if [[ "${PIN:-0}" == 1 ]]; then
    command -v taskset >/dev/null || die "PIN=1 needs taskset (util-linux)"
    [[ $(nproc) -ge 2 ]] || die "PIN=1 needs two CPUs"
    ON_GW=(taskset -c 1) ON_REST=(taskset -c 0)
    say "pinned: gateways on CPU 1; load generator, upstreams and redis-server on CPU 0"
fi
# Thousands of sockets in the streams phase (client side and upstream side).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
"${ON_REST[@]}" "$MOCK" --listen 127.0.0.1:0 >"$TMP/mock.out" 2>"$TMP/mock.err" &
PIDS+=($!)
MOCK_ADDR=$(wait_listening "$TMP/mock.out" "mock_upstream listening on" "$!") ||
    die "mock upstream did not start: $(tail -5 "$TMP/mock.err")"
say "mock upstream on $MOCK_ADDR (no token delay)"
# A slow upstream (20 ms per token: a 64-token stream lasts ~1.3 s) keeps
# streams open for the concurrent-streams phase.
"${ON_REST[@]}" "$MOCK" --listen 127.0.0.1:0 --token-delay-ms 20 >"$TMP/slow.out" 2>"$TMP/slow.err" &
PIDS+=($!)
SLOW_ADDR=$(wait_listening "$TMP/slow.out" "mock_upstream listening on" "$!") ||
    die "slow mock upstream did not start: $(tail -5 "$TMP/slow.err")"

KEY="sk-bench-$$"
KEY_SHA=$(printf '%s' "$KEY" | sha256sum | cut -d' ' -f1)

write_config() { # $1 file, $2 store section
    local ledger=""
    [[ ${LEDGER:-off} == off ]] && ledger=$'\n[ledger]\nenabled = false'
    cat >"$1" <<EOF
# Written by scripts/bench.sh: limits high enough never to refuse.
[server]
listen = "127.0.0.1:0"

[control]
database_url = "sqlite://$1.control.db"$ledger

[store]
$2

[[upstreams]]
name = "mock"
kind = "self_hosted"
base_url = "http://$MOCK_ADDR/v1"
limits = { rpm = 50000000, tpm = 50000000, max_concurrent = 100000 }

[[upstreams]]
name = "slow"
kind = "self_hosted"
base_url = "http://$SLOW_ADDR/v1"
limits = { rpm = 50000000, tpm = 50000000, max_concurrent = 100000 }

[[models]]
name = "gpt-4o-mini-slow"
upstreams = ["slow"]
encoding = "o200k_base"
default_max_output_tokens = 256
max_output_tokens = 16384

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
}

declare -A ADDR GW_PID IDLE_RSS
TARGETS=(direct)
ADDR[direct]=$MOCK_ADDR

start_gateway() { # $1 name, $2 config, $3 binary (default: this build's)
    local name=$1 cfg=$2 bin=${3:-$GATEWAY} pid addr
    # A state directory of its own: the default one may be held by a gateway the user runs.
    mkdir -p "$TMP/$name.state"
    STATE_DIRECTORY="$TMP/$name.state" "${ON_GW[@]}" "$bin" serve --config "$cfg" --listen 127.0.0.1:0 >"$TMP/$name.out" 2>"$TMP/$name.err" &
    pid=$!
    PIDS+=("$pid")
    if ! addr=$(wait_listening "$TMP/$name.out" "budgetgate listening on" "$pid"); then
        say "gateway $name did not start; skipping it. Its log:"
        tail -5 "$TMP/$name.err" >&2 || true
        kill "$pid" 2>/dev/null || true
        return 1
    fi
    ADDR[$name]=$addr
    GW_PID[$name]=$pid
    TARGETS+=("$name")
    sleep 0.5
    IDLE_RSS[$name]=$(rss_kb "$pid" VmRSS)
    say "gateway $name on $addr (pid $pid)"
}

# --- the forwarding floor: a bare reverse proxy to the same mock -------------
if [[ "${FLOOR:-1}" != 0 ]]; then
    if ! command -v nginx >/dev/null && ! [[ -x /usr/sbin/nginx ]]; then
        SUDO=""
        [[ $(id -u) -ne 0 ]] && SUDO=sudo
        say "nginx not found: installing Debian's nginx-light (apt-get)"
        $SUDO apt-get update -qq >&2 || true
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nginx-light >&2 ||
            die "could not install nginx-light (FLOOR=0 skips the floor)"
    fi
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    NPORT=$(free_port) || die "no free port for nginx"
    mkdir -p "$TMP/nginx"
    cat >"$TMP/nginx/nginx.conf" <<EOF
# Written by scripts/bench.sh: forwarding only, the floor under any gateway.
daemon off;
user $(id -un);
worker_processes $(nproc);
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
events { worker_connections 65536; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    upstream mock {
        server $MOCK_ADDR;
        keepalive 256;
    }
    server {
        listen 127.0.0.1:$NPORT;
        location / {
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
EOF
    "${ON_GW[@]}" "$NGINX" -e "$TMP/nginx/error.log" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" >"$TMP/nginx.out" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 50); do
        port_free "$NPORT" || break
        sleep 0.1
    done
    if port_free "$NPORT"; then
        say "nginx did not start; no floor. Its log:"; tail -5 "$TMP/nginx.out" "$TMP/nginx/error.log" >&2 || true
    else
        ADDR[floor]=127.0.0.1:$NPORT
        TARGETS+=(floor)
        say "forwarding floor: $("$NGINX" -v 2>&1) on 127.0.0.1:$NPORT, keepalive to the mock"
    fi
fi

write_config "$TMP/memory.toml" 'kind = "memory"'
start_gateway gw-memory "$TMP/memory.toml" || die "the memory-store gateway must start"
if [[ -n "${BASELINE:-}" ]]; then
    write_config "$TMP/base.toml" 'kind = "memory"'
    start_gateway gw-base "$TMP/base.toml" "$BASELINE" || die "the baseline gateway must start"
fi

if [[ "${REDIS:-1}" != 0 ]]; then
    if command -v redis-server >/dev/null; then
        RPORT=$(free_port) || die "no free port for redis-server"
        "${ON_REST[@]}" redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no \
            >"$TMP/redis.log" 2>&1 &
        PIDS+=($!)
        for _ in $(seq 1 50); do
            redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
        say "redis-server on 127.0.0.1:$RPORT"
        LEASE_TOML=""
        [[ ${LEASE:-auto} == off ]] && LEASE_TOML=$'\n[store.lease]\nmode = "off"'
        write_config "$TMP/redis.toml" "kind = \"redis\"
url = \"redis://127.0.0.1:$RPORT/\"$LEASE_TOML"
        start_gateway gw-redis "$TMP/redis.toml" || true
    else
        say "redis-server not installed: skipping the Redis-store gateway"
    fi
fi

# --- load -------------------------------------------------------------------
if [[ " $MODES " == *" agent "* ]]; then
    # The agent turn: examples/agent_replay's deterministic growth of a
    # recorded Codex first turn (its model renamed to gpt-4o-mini).
    REPLAY="$TARGET_DIR/release/examples/agent_replay"
    [[ -x $REPLAY ]] || die "release binary missing: $REPLAY"
    "$REPLAY" "$TMP/turns" >"$TMP/turns.tsv" || die "agent_replay failed"
    AGENT_TURN=${AGENT_TURN:-codex-0.171.0-30k.json}
    AGENT_PATH=$(awk -F'\t' -v n="$AGENT_TURN" '$1 == n { print $2 }' "$TMP/turns.tsv")
    [[ -n $AGENT_PATH ]] || die "no agent turn $AGENT_TURN (see $TMP/turns.tsv)"
    AGENT_FILE="$TMP/turns/$AGENT_TURN"
    say "agent turn $AGENT_TURN: $(wc -c <"$AGENT_FILE") bytes, $(awk -F'\t' -v n="$AGENT_TURN" '$1 == n { print $4 }' "$TMP/turns.tsv") input tokens, to $AGENT_PATH"
fi
BODY_NONSTREAM='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64}'
BODY_STREAM='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64,"stream":true}'

run_oha() { # $1 addr, $2 body (or @file), $3 concurrency, $4 duration, $5 path
    local data=(-d "$2")
    [[ $2 == @* ]] && data=(-D "${2#@}")
    "${ON_REST[@]}" oha "${OHA_EXTRA[@]}" "${OHA_JSON[@]}" -z "$4" -c "$3" -m POST \
        -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
        "${data[@]}" "http://$1${5:-/v1/chat/completions}"
}

npoints=0
for _ in $MODES; do for _ in $CONCURRENCY; do npoints=$((npoints + ${#TARGETS[@]})); done; done
say "targets: ${TARGETS[*]}; $npoints points of $DURATION after $WARMUP warm-up each"

RESULTS="$TMP/results.tsv"
: >"$RESULTS"
CPU="$TMP/cpu.txt"
: >"$CPU"
# utime and stime of a process, in clock ticks ("" for no process).
cpu_ticks() { [[ -n $1 ]] && awk '{ print $14, $15 }' "/proc/$1/stat" 2>/dev/null || true; }
for mode in $MODES; do
    path=/v1/chat/completions
    case $mode in
        stream) body=$BODY_STREAM ;;
        agent) body="@$AGENT_FILE" path=${AGENT_PATH%%\?*} ;;
        *) body=$BODY_NONSTREAM ;;
    esac
    for c in $CONCURRENCY; do
        for t in "${TARGETS[@]}"; do
            run_oha "${ADDR[$t]}" "$body" "$c" "$WARMUP" "$path" >/dev/null 2>&1 || true
            out="$TMP/oha-$t-$mode-$c.json"
            ticks0=$(cpu_ticks "${GW_PID[$t]:-}")
            run_oha "${ADDR[$t]}" "$body" "$c" "$DURATION" "$path" >"$out" 2>"$out.err" ||
                die "oha failed for $t $mode c=$c: $(tail -3 "$out.err")"
            ticks1=$(cpu_ticks "${GW_PID[$t]:-}")
            if [[ -n $ticks0 && -n $ticks1 ]]; then
                # The gateway's user and kernel CPU over the measured run.
                echo "$t $mode $c $ticks0 $ticks1 $(jq -r '.summary.requestsPerSec * .summary.total' "$out")" >>"$CPU"
            fi
            jq -r --arg t "$t" --arg m "$mode" --arg c "$c" '
                [$t, $m, $c,
                 .summary.requestsPerSec,
                 .latencyPercentiles.p50 * 1000,
                 .latencyPercentiles.p99 * 1000,
                 ([.statusCodeDistribution | to_entries[] | select(.key | startswith("2") | not) | .value] | add // 0),
                 ([.statusCodeDistribution | to_entries[] | select(.key | startswith("2") | not) | "\(.key):\(.value)"] | join(",")),
                 ([.errorDistribution // {} | to_entries[] | .value] | add // 0)
                ] | @tsv' "$out" >>"$RESULTS"
            say "$(tail -1 "$RESULTS")"
        done
    done
done

# --- concurrent streams ------------------------------------------------------
# STREAMS clients each hold a stream from the slow upstream open (~1.3 s),
# back to back, for 8 s; RSS is sampled while they are all in flight.
STREAMS=${STREAMS:-1000}
PHASES="$TMP/phases.txt"
: >"$PHASES"
if [[ "$STREAMS" != 0 ]]; then
    SLOW_BODY='{"model":"gpt-4o-mini-slow","messages":[{"role":"user","content":"Count to sixty-four."}],"max_tokens":64,"stream":true}'
    for t in "${TARGETS[@]}"; do
        [[ $t == direct || $t == floor || $t == gw-base ]] && continue
        pid=${GW_PID[$t]}
        out="$TMP/streams-$t.json"
        say "$t: $STREAMS concurrent streams for 8 s"
        run_oha "${ADDR[$t]}" "$SLOW_BODY" "$STREAMS" 8s >"$out" 2>"$out.err" &
        oha_pid=$!
        sleep 5
        during=$(rss_kb "$pid" VmRSS)
        wait "$oha_pid" || die "oha failed for $t streams: $(tail -3 "$out.err")"
        jq -r --arg t "$t" --arg n "$STREAMS" --arg during "$during" --arg peak "$(rss_kb "$pid" VmHWM)" '
            "\($t): \($n) concurrent streams: \(.summary.requestsPerSec | floor) streams/s, p50 \(.latencyPercentiles.p50 * 1000 | floor) ms, " +
            "non-2xx \([.statusCodeDistribution | to_entries[] | select(.key | startswith("2") | not) | .value] | add // 0), " +
            "errors \([.errorDistribution // {} | to_entries[] | .value] | add // 0); " +
            "RSS with them in flight \(($during | tonumber) / 1024 | floor) MB, peak (VmHWM) \(($peak | tonumber) / 1024 | floor) MB"' \
            "$out" >>"$PHASES"
        say "$(tail -1 "$PHASES")"
    done
fi

# --- cold large prompts beside small requests ---------------------------------
# Small requests at concurrency 4 alone, then while two clients send 400 KB
# prompts never seen before (a random number first: the token-count cache
# cannot help), back to back. Counting one costs ~20 ms of CPU; it runs on
# the blocking pool, so the small requests' p99 should barely move.
if [[ "${COLD:-1}" != 0 ]]; then
    t=gw-memory
    say "$t: small requests alone, then beside cold 400 KB prompts"
    run_oha "${ADDR[$t]}" "$BODY_NONSTREAM" 4 "$WARMUP" >/dev/null 2>&1 || true
    run_oha "${ADDR[$t]}" "$BODY_NONSTREAM" 4 "$DURATION" >"$TMP/cold-alone.json" 2>/dev/null ||
        die "oha failed (small requests alone)"
    rm -f "$TMP/cold.stop"
    for i in 1 2; do
        python3 - "${ADDR[$t]}" "$KEY" "$TMP/cold.stop" >"$TMP/cold-$i.out" 2>"$TMP/cold-$i.err" <<'PY' &
import http.client, json, os, random, sys, time
addr, key, stop = sys.argv[1], sys.argv[2], sys.argv[3]
host, port = addr.rsplit(":", 1)
words = ("budget token gateway stream reserve settle refund quota tenant upstream "
         "latency deployment minute bucket window lease").split()
rng = random.Random(os.getpid())
filler = " ".join(rng.choice(words) + str(rng.randrange(1000)) for _ in range(60000))[:400_000]
conn = http.client.HTTPConnection(host, int(port), timeout=60)
sent, nbytes, secs = 0, 0, 0.0
while not os.path.exists(stop):
    body = json.dumps({"model": "gpt-4o-mini", "max_tokens": 16, "messages": [
        {"role": "user", "content": f"{rng.random()} {filler}"}]}).encode()
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse(); r.read()
    secs += time.perf_counter() - t0
    if r.status == 200:
        sent += 1; nbytes += len(body)
print(sent, nbytes, secs)
PY
    done
    sleep 1
    run_oha "${ADDR[$t]}" "$BODY_NONSTREAM" 4 "$DURATION" >"$TMP/cold-beside.json" 2>/dev/null ||
        die "oha failed (small requests beside cold prompts)"
    touch "$TMP/cold.stop"
    wait_cold() { local f; for f in "$TMP"/cold-[12].out; do for _ in $(seq 1 600); do [[ -s $f ]] && break; sleep 0.1; done; done; }
    wait_cold
    read -r n1 b1 s1 <"$TMP/cold-1.out" || true
    read -r n2 b2 s2 <"$TMP/cold-2.out" || true
    jq -rn --slurpfile a "$TMP/cold-alone.json" --slurpfile b "$TMP/cold-beside.json" \
        --arg n "$(( ${n1:-0} + ${n2:-0} ))" --arg mb "$(( (${b1:-0} + ${b2:-0}) / 1000000 ))" \
        --arg secs "$(awk -v a="${s1:-0}" -v b="${s2:-0}" -v n="$(( ${n1:-0} + ${n2:-0} ))" 'BEGIN { if (n > 0) printf "%.1f", (a + b) * 1000 / n; else print "-" }')" '
        "gw-memory: small requests (c=4) p50/p99 \($a[0].latencyPercentiles.p50 * 1000 * 1000 | floor / 1000)/\($a[0].latencyPercentiles.p99 * 1000 * 1000 | floor / 1000) ms alone, " +
        "\($b[0].latencyPercentiles.p50 * 1000 * 1000 | floor / 1000)/\($b[0].latencyPercentiles.p99 * 1000 * 1000 | floor / 1000) ms beside \($n) cold 400 KB prompts (\($mb) MB, \($secs) ms each end to end)"' >>"$PHASES"
    say "$(tail -1 "$PHASES")"
fi

# --- report -----------------------------------------------------------------
echo
if [[ "${PIN:-0}" == 1 ]]; then
    echo "budgetgate benchmark: $(date -u +%FT%TZ), $(nproc) CPUs, pinned: gateways on CPU 1, load generator, upstream and redis on CPU 0"
else
    echo "budgetgate benchmark: $(date -u +%FT%TZ), $(nproc) CPUs, load generator, upstream, redis and gateway on one machine"
fi
echo "oha -z $DURATION after $WARMUP warm-up; gateway RUST_LOG=$RUST_LOG; latencies in ms; added = gateway − direct at the same mode and concurrency"
echo
awk -F'\t' '
    { key = $2 "/" $3; if ($1 == "direct") { drps[key] = $4; dp50[key] = $5; dp99[key] = $6 }
      if ($1 == "floor") { frps[key] = $4; fp50[key] = $5 }
      row[NR] = $0 }
    END {
        printf "%-10s %-9s %5s %10s %9s %9s %10s %10s %11s %10s %12s %8s  %s\n",
            "target", "mode", "conc", "RPS", "p50", "p99", "added p50", "added p99", "RPS/direct", "RPS/floor", "added/floor", "non-2xx", "statuses"
        for (i = 1; i <= NR; i++) {
            split(row[i], f, "\t"); key = f[2] "/" f[3]
            if (f[1] == "direct") { a50 = "-"; a99 = "-"; ratio = "-"; rfloor = "-"; afloor = "-" }
            else {
                a50 = sprintf("%+.3f", f[5] - dp50[key]); a99 = sprintf("%+.3f", f[6] - dp99[key])
                ratio = (drps[key] > 0) ? sprintf("%.2f", f[4] / drps[key]) : "-"
                rfloor = (frps[key] > 0) ? sprintf("%.2f", f[4] / frps[key]) : "-"
                fadd = fp50[key] - dp50[key]
                afloor = (key in fp50 && fadd > 0) ? sprintf("%.1f", (f[5] - dp50[key]) / fadd) : "-"
            }
            printf "%-10s %-9s %5s %10.0f %9.3f %9.3f %10s %10s %11s %10s %12s %8d  %s\n",
                f[1], f[2], f[3], f[4], f[5], f[6], a50, a99, ratio, rfloor, afloor, f[7], f[8]
        }
    }' "$RESULTS"
echo
for t in "${TARGETS[@]}"; do
    [[ $t == direct || $t == floor ]] && continue
    pid=${GW_PID[$t]}
    awk -v t="$t" -v idle="${IDLE_RSS[$t]:-0}" -v peak="$(rss_kb "$pid" VmHWM)" \
        'BEGIN { printf "%s: RSS idle %.1f MB, peak (VmHWM) %.1f MB\n", t, idle / 1024, peak / 1024 }'
done
if [[ -s $CPU ]]; then
    echo
    echo "gateway CPU per request over each measured run (/proc/<pid>/stat; kernel: the gateway's system calls):"
    awk -v hz="$(getconf CLK_TCK)" '{
        n = $8
        if (n > 0) printf "%-10s %-9s c=%-3s user %6.0f us  kernel %6.0f us\n", $1, $2, $3, ($6 - $4) / hz / n * 1e6, ($7 - $5) / hz / n * 1e6
    }' "$CPU"
fi
if [[ -s $PHASES ]]; then
    echo
    cat "$PHASES"
fi
