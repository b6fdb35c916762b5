#!/usr/bin/env bash
# Instructions per request of the gateway (user space), counted by
# valgrind's callgrind: a figure that does not depend on what else the
# machine is doing, for comparing two versions of the hot path
# (docs/PERFORMANCE.md, "How to measure").
#
#   scripts/instructions.sh            # memory store, 2,000 requests at c=1
#   STORE=redis scripts/instructions.sh  # Redis store (a private redis-server;
#                                        # counts the gateway only, not Redis)
#   PROFILE=redis scripts/instructions.sh  # Redis store; counts redis-server
#                                        # instead (reserve + settle scripts)
#   REQUESTS=5000 scripts/instructions.sh
#   CONC=16 PROFILE=redis scripts/instructions.sh  # 16 clients: Redis calls
#                                        # then go in batches (lua/batch.lua)
#   SHAPE=deep PROFILE=redis scripts/instructions.sh  # the cost of depth: a
#                                        # tenant 4 levels deep with an end user,
#                                        # 40 budgets per request (default: 7)
#   BUILD=debug PROFILE=redis scripts/instructions.sh  # debug binaries (only
#                                        # with PROFILE=redis: Redis is counted)
#   LEASE=on STORE=redis scripts/instructions.sh  # quota leases from the first
#                                        # requests (min_rate 1): the leased path;
#                                        # default LEASE=off, one store call each
#   LEASE=deployment LAYOUT=tenant STORE=redis scripts/instructions.sh  # the
#                                        # deployment leased, the tenant exact
#                                        # (`lease = "off"`): a split, one call
#   LAYOUT=tenant STORE=redis scripts/instructions.sh  # the tenant key layout
#                                        # (store.layout): the tenant's budgets and the
#                                        # deployment's in two domains, so an exact
#                                        # deployment budget is a second call (with
#                                        # LEASE=on the deployment is leased: one call)
#   WINDOW=week SHAPE=deep PROFILE=redis scripts/instructions.sh  # every
#                                        # tokens_per_day quota a rolling weekly
#                                        # window instead (tokens_per_week)
#   RUN=on scripts/instructions.sh       # every request names a run
#                                        # (x-budgetgate-run, with run limits of its own:
#                                        # three more budgets in the reservation)
#   LEDGER=off scripts/instructions.sh   # without the spend ledger (default: on,
#                                        # as `serve` runs it: SQLite in the temp dir)
#   QUEUE=on scripts/instructions.sh     # with a [queue] configured (uncontended:
#                                        # nobody waits)
#   TELEMETRY=on scripts/instructions.sh # request spans exported over OTLP/HTTP
#                                        # (to the mock upstream, which refuses
#                                        # them: the export work is done all the same)
#   MODE=stream scripts/instructions.sh  # streamed requests, one figure per
#                                        # dialect (chat completions, Responses,
#                                        # Messages): 64 one-token deltas each from
#                                        # the mock; default 500 streams per dialect
#   DIALECTS="chat" MODE=stream scripts/instructions.sh  # only these dialects
#   DIALECTS=gemini MODE=stream scripts/instructions.sh  # Gemini's own streams
#   CAP=256 MODE=stream scripts/instructions.sh  # max_tokens of the streams
#                                        # (default 64: the stream ends at its cap)
#   MODE=agent scripts/instructions.sh   # agent turns of ~15k, 30k and 60k input
#                                        # tokens (examples/agent_replay), streamed:
#                                        # token-count cache cold and warm (WARM=20
#                                        # turns), the tokenizer's share, per KB
#
# Needs valgrind, oha (scripts/bench.sh installs it; else curl, c=1) and release binaries
# (`cargo build --release --bins --examples`). Writes the callgrind profile
# to target/callgrind.out.<pid>.1-<thread> (one file per thread) for
# `callgrind_annotate --inclusive=yes`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
MODE=${MODE:-nonstream}
if [[ $MODE == stream ]]; then REQUESTS=${REQUESTS:-500}; else REQUESTS=${REQUESTS:-2000}; fi
DIALECTS=${DIALECTS:-chat responses messages}
# The streams' max_tokens: 64, the mock's 64 tokens, makes every stream end
# at its cap (the relay must count it out exactly); above 64 it ends
# inside its reservation.
CAP=${CAP:-64}
STORE=${STORE:-memory}
# Which process callgrind counts: the gateway, or (PROFILE=redis, which
# implies STORE=redis) the redis-server its budgets live in.
PROFILE=${PROFILE:-gateway}
CONC=${CONC:-1}
SHAPE=${SHAPE:-flat}
LEASE=${LEASE:-off}
LEDGER=${LEDGER:-on}
QUEUE=${QUEUE:-off}
TELEMETRY=${TELEMETRY:-off}
LAYOUT=${LAYOUT:-single}
WINDOW=${WINDOW:-day}
RUN=${RUN:-off}
RUN_HEADERS=()
if [[ $RUN == on ]]; then
    RUN_HEADERS=(-H "x-budgetgate-run: instructions-run" -H "x-budgetgate-run-limits: tokens=1000000000000, requests=1000000000000, window=24h")
fi
[[ $LAYOUT == single || $LAYOUT == tenant ]] || { echo "LAYOUT is single or tenant" >&2; exit 1; }
[[ $WINDOW == day || $WINDOW == week ]] || { echo "WINDOW is day or week" >&2; exit 1; }
BUILD=${BUILD:-release}
[[ $PROFILE == redis ]] && STORE=redis
[[ $BUILD == release || $PROFILE == redis ]] || { echo "BUILD=debug counts a debug gateway: use it with PROFILE=redis only" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "valgrind is required (apt-get install -y valgrind)" >&2; exit 1; }
# The load: oha, or without it curl (c=1 only: one kept-alive connection
# for all the requests of one load; a few more request headers than oha's,
# so compare figures taken with the same client).
if command -v oha >/dev/null; then LOADER=oha; else LOADER=curl; fi
[[ $LOADER == oha || $CONC == 1 ]] || { echo "CONC=$CONC needs oha (cargo install oha --locked)" >&2; exit 1; }
GATEWAY=target/$BUILD/budgetgate
MOCK=target/$BUILD/examples/mock_upstream
[[ -x $GATEWAY && -x $MOCK ]] || { echo "build first: cargo build --release --bins --examples" >&2; exit 1; }

TMP=$(mktemp -d /tmp/budgetgate-instructions.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

wait_line() { # $1 file, $2 prefix (up to 5 minutes: start-up under
              # valgrind on a busy machine takes a while)
    for _ in $(seq 1 3000); do
        grep -q "^$2 http://" "$1" 2>/dev/null && { grep -m1 "^$2 http://" "$1" | sed "s|^$2 http://||"; return 0; }
        sleep 0.1
    done
    return 1
}

"$MOCK" --listen 127.0.0.1:0 >"$TMP/mock.out" 2>&1 &
PIDS+=($!)
MOCK_ADDR=$(wait_line "$TMP/mock.out" "mock_upstream listening on")
STORE_TOML='kind = "memory"'
if [[ $STORE == redis ]]; then
    command -v redis-server >/dev/null || { echo "redis-server is required" >&2; exit 1; }
    RPORT=$((20000 + RANDOM % 40000))
    REDIS_CMD=(redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no)
    if [[ $PROFILE == redis ]]; then
        REDIS_CMD=(valgrind --tool=callgrind --callgrind-out-file="$PWD/target/callgrind.out.%p" "${REDIS_CMD[@]}")
    fi
    "${REDIS_CMD[@]}" >"$TMP/redis.out" 2>&1 &
    REDIS_PID=$!
    PIDS+=($REDIS_PID)
    for _ in $(seq 1 300); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
    # Under valgrind a script runs ~50 times slower: give calls time.
    STORE_TOML="kind = \"redis\"
url = \"redis://127.0.0.1:$RPORT/\"
timeout_ms = 5000
layout = \"$LAYOUT\""
    if [[ $LEASE == on || $LEASE == deployment ]]; then
        STORE_TOML="$STORE_TOML
[store.lease]
min_rate = 1"
    else
        STORE_TOML="$STORE_TOML
[store.lease]
mode = \"off\""
    fi
fi
KEY="sk-instructions-$$"
SHA=$(printf '%s' "$KEY" | sha256sum | cut -d' ' -f1)
cat >"$TMP/gw.toml" <<EOF
[server]
listen = "127.0.0.1:0"
[store]
$STORE_TOML
[[upstreams]]
name = "mock"
kind = "self_hosted"
base_url = "http://$MOCK_ADDR/v1"
limits = { rpm = 50000000, tpm = 50000000, max_concurrent = 100000 }
[[models]]
name = "gpt-4o-mini"
upstreams = ["mock"]
encoding = "o200k_base"
EOF
if [[ $MODE == stream || $MODE == agent ]]; then
    # Messages streams: the mock's /v1/messages as an Anthropic upstream.
    export BUDGETGATE_INSTRUCTIONS_ANTHROPIC_KEY="mock-key"
    cat >>"$TMP/gw.toml" <<EOF
[[upstreams]]
name = "claude"
kind = "anthropic"
base_url = "http://$MOCK_ADDR"
api_key_env = "BUDGETGATE_INSTRUCTIONS_ANTHROPIC_KEY"
limits = { rpm = 50000000, tpm = 50000000, max_concurrent = 100000 }
[[models]]
name = "claude-test"
upstreams = ["claude"]
encoding = "o200k_base"
token_ratio = 1000
[[upstreams]]
name = "gemini"
kind = "gemini"
base_url = "http://$MOCK_ADDR/v1beta"
api_key_env = "BUDGETGATE_INSTRUCTIONS_ANTHROPIC_KEY"
limits = { rpm = 50000000, tpm = 50000000, max_concurrent = 100000 }
[[models]]
name = "gemini-test"
upstreams = ["gemini"]
encoding = "o200k_base"
token_ratio = 1000
EOF
fi
BIG='rpm = 50000000, tpm = 50000000, max_concurrent = 100000, tokens_per_day = 50000000000'
if [[ $SHAPE == deep ]]; then
    # 40 budgets: six on each of four levels, three on the key, rpm and tpm
    # of the model on two levels, six on the end user, the deployment's three.
    SIX="$BIG, tokens_per_month = 500000000000, requests_per_day = 50000000000"
    MODEL='model_limits = { "gpt-4o-mini" = { rpm = 50000000, tpm = 50000000 } }'
    cat >>"$TMP/gw.toml" <<EOF
[[tenants]]
name = "org"
limits = { $SIX }
$MODEL
[[tenants]]
name = "dept"
parent = "org"
limits = { $SIX }
[[tenants]]
name = "team"
parent = "dept"
limits = { $SIX }
[[tenants]]
name = "bench"
parent = "team"
keys = [{ id = "bench", sha256 = "$SHA", limits = { rpm = 50000000, tpm = 50000000, tokens_per_day = 50000000000 } }]
limits = { $SIX }
$MODEL
end_user_limits = { $SIX }
EOF
    export BUDGETGATE_END_USER_KEY="instructions-script-end-user-key"
else
    cat >>"$TMP/gw.toml" <<EOF
[[tenants]]
name = "bench"
keys = [{ id = "bench", sha256 = "$SHA" }]
limits = { $BIG }
EOF
fi
if [[ $LEASE == deployment ]]; then
    # Every tenant's budgets exact; the deployment's leased.
    sed -i 's/^\[\[tenants\]\]$/[[tenants]]\nlease = "off"/' "$TMP/gw.toml"
fi
if [[ $WINDOW == week ]]; then
    # The same limits, each daily token quota a rolling week's.
    sed -i 's/tokens_per_day = /tokens_per_week = /g' "$TMP/gw.toml"
fi
cat >>"$TMP/gw.toml" <<EOF
[control]
database_url = "sqlite://$TMP/control.db"
EOF
if [[ $LEDGER == off ]]; then
    printf '[ledger]\nenabled = false\n' >>"$TMP/gw.toml"
fi
if [[ $QUEUE == on ]]; then
    printf '[queue]\nmax_queued = 10000\n' >>"$TMP/gw.toml"
fi
if [[ $TELEMETRY == on ]]; then
    printf '[telemetry]\notlp_endpoint = "http://%s"\n' "$MOCK_ADDR" >>"$TMP/gw.toml"
fi
GW_CMD=("$GATEWAY" serve --threads 1 --config "$TMP/gw.toml")
if [[ $PROFILE == gateway ]]; then
    # One profile per thread: the serving thread's count is the hot path;
    # the ledger's writer and the database driver's threads work off it.
    GW_CMD=(valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$PWD/target/callgrind.out.%p" "${GW_CMD[@]}")
fi
# Its own state directory (snapshot, control database, ledger): the default
# one may be held by a gateway running on this machine ("in use by another
# budgetgate process"); a new one for each gateway of MODE=agent.
GATEWAYS=0
start_gateway() {
    GATEWAYS=$((GATEWAYS + 1))
    DUMP=0
    mkdir -p "$TMP/state.$GATEWAYS"
    STATE_DIRECTORY="$TMP/state.$GATEWAYS" RUST_LOG=warn "${GW_CMD[@]}" >"$TMP/gw.out" 2>"$TMP/gw.err" &
    GW_PID=$!
    PIDS+=($GW_PID)
    if [[ $PROFILE == redis ]]; then VG=$REDIS_PID; else VG=$GW_PID; fi
    ADDR=$(wait_line "$TMP/gw.out" "budgetgate listening on") || { tail -5 "$TMP/gw.err" >&2; exit 1; }
}
stop_gateway() {
    kill "$GW_PID" 2>/dev/null || true
    wait "$GW_PID" 2>/dev/null || true
}
[[ $MODE == agent ]] || start_gateway   # agent turns: one gateway per turn
BODY='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64}'
URL_PATH=/v1/chat/completions
HEADERS=(-H "Authorization: Bearer $KEY")
dialect() { # $1 chat | responses | messages: the BODY, URL_PATH, HEADERS of its stream
    HEADERS=(-H "Authorization: Bearer $KEY")
    case $1 in
        chat) URL_PATH=/v1/chat/completions
              BODY='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":'$CAP',"stream":true}' ;;
        responses) URL_PATH=/v1/responses
              BODY='{"model":"gpt-4o-mini","instructions":"You are a helpful assistant.","input":"Say hello in one short sentence.","max_output_tokens":'$CAP',"stream":true}' ;;
        messages) URL_PATH=/v1/messages
              HEADERS=(-H "x-api-key: $KEY" -H "anthropic-version: 2023-06-01")
              BODY='{"model":"claude-test","system":"You are a helpful assistant.","messages":[{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":'$CAP',"stream":true}' ;;
        gemini) URL_PATH='/v1beta/models/gemini-test:streamGenerateContent?alt=sse'
              HEADERS=(-H "x-goog-api-key: $KEY")
              BODY='{"systemInstruction":{"parts":[{"text":"You are a helpful assistant."}]},"contents":[{"role":"user","parts":[{"text":"Say hello in one short sentence."}]}],"generationConfig":{"maxOutputTokens":'$CAP'}}' ;;
        *) echo "unknown dialect $1 (chat, responses, messages, gemini)" >&2; exit 1 ;;
    esac
}
load() {
    if [[ $LOADER == curl ]]; then
        local urls=() data=(--data-binary "$BODY") i
        [[ ${BODY_ARG[0]} == -D ]] && data=(--data-binary "@${BODY_ARG[1]}")
        for ((i = 0; i < $1; i++)); do urls+=("http://$ADDR$URL_PATH"); done
        curl -sS -X POST "${HEADERS[@]}" "${RUN_HEADERS[@]}" -H "x-budgetgate-end-user: user-1" \
            -H 'content-type: application/json' "${data[@]}" "${urls[@]}" >/dev/null
        return
    fi
    oha --no-tui -n "$1" -c "$CONC" -m POST "${HEADERS[@]}" "${RUN_HEADERS[@]}" -H "x-budgetgate-end-user: user-1" \
    -H 'content-type: application/json' "${BODY_ARG[@]}" "http://$ADDR$URL_PATH" >/dev/null; }
# The body as oha takes it: inline, or (BODY_FILE, for agent turns larger
# than one argument may be) from its file.
body_arg() { if [[ -n ${BODY_FILE:-} ]]; then BODY_ARG=(-D "$BODY_FILE"); else BODY_ARG=(-d "$BODY"); fi; }
# A stream that does not come back whole (a wrong route or model) would
# be measured as a cheap error: check one first.
check_stream() {
    local out
    local data=("-d" "$BODY")
    [[ -n ${BODY_FILE:-} ]] && data=(--data-binary "@$BODY_FILE")
    out=$(curl -sS -N -X POST "${HEADERS[@]}" -H 'content-type: application/json' "${data[@]}" "http://$ADDR$URL_PATH")
    grep -Eq '\[DONE\]|response\.completed|message_stop|"finishReason"' <<<"$out" ||
        { echo "no complete stream from $URL_PATH: ${out:0:300}" >&2; exit 1; }
}
DUMP=0
# Counts $REQUESTS requests: zero the counters, load, dump. Dump N's files
# are target/callgrind.out.<pid>.N-<thread> (one per thread).
measure() { # $1 what is measured, for the figure's line
    body_arg
    load 300                   # warm-up: caches, pooled connections
    callgrind_control -z "$VG" >/dev/null
    load "$REQUESTS"
    sleep 1                    # let the last settles land
    callgrind_control -d "$VG" >/dev/null
    DUMP=$((DUMP + 1))
    sleep 1
    if [[ $PROFILE == redis ]]; then
        OUT=$(ls -t target/callgrind.out.* | head -1)
        TOTAL=$(callgrind_annotate "$OUT" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
        echo "redis-server instructions per request (reserve + settle, c=$CONC, shape $SHAPE, layout $LAYOUT, quotas per $WINDOW, run $RUN$1): $((TOTAL / REQUESTS)) over $REQUESTS requests"
        echo "profile: $OUT (callgrind_annotate --inclusive=yes $OUT | head -60)"
        return 0
    fi
    shopt -s nullglob
    OUTS=("target/callgrind.out.$VG".$DUMP-*)
    [[ ${#OUTS[@]} -gt 0 ]] || { echo "no callgrind dump of process $VG" >&2; exit 1; }
    SERVING=0 LEDGER_THREAD=0 OTHER=0
    for f in "${OUTS[@]}"; do
        n=$(awk '/^(summary|totals):/ { print $2; exit }' "$f")
        n=${n:-0}
        if grep -Eq 'serve_connections|connections::spawn_connection' "$f"; then
            SERVING=$((SERVING + n))           # a serving thread (thread 0 is main)
        elif grep -q 'ledger::batcher::writer_thread' "$f"; then
            LEDGER_THREAD=$((LEDGER_THREAD + n))
        else
            OTHER=$((OTHER + n))               # SQLite connections, snapshots, helpers
        fi
    done
    TOTAL=$((SERVING + LEDGER_THREAD + OTHER))
    # The serving figure is the hot path, the one compared across versions.
    # The ledger's writer thread and the background threads (SQLite's
    # connection threads, the ledger's and the control plane's; the memory
    # store's snapshots) work off the request path and are counted apart.
    echo "instructions per request ($STORE store, 1 serving thread, c=$CONC, shape $SHAPE, layout $LAYOUT, quotas per $WINDOW, run $RUN$1): $((SERVING / REQUESTS)) over $REQUESTS requests"
    echo "  off the request path: ledger writer thread $((LEDGER_THREAD / REQUESTS)), background threads $((OTHER / REQUESTS)); whole process $((TOTAL / REQUESTS))"
    echo "profiles: ${OUTS[*]} (callgrind_annotate --inclusive=yes FILE | head -60)"
}
# Sums dump $DUMP of the gateway: SERVING (the serving thread), ESTIMATING
# (the estimation threads, where bodies above 32 KB are counted) and
# TOKENIZER (callgrind's inclusive cost of the tokenizer's entry point,
# tiktoken's encode, on either).
count_dump() {
    shopt -s nullglob
    OUTS=("target/callgrind.out.$VG".$DUMP-*)
    [[ ${#OUTS[@]} -gt 0 ]] || { echo "no callgrind dump of process $VG" >&2; exit 1; }
    SERVING=0 ESTIMATING=0 TOKENIZER=0
    for f in "${OUTS[@]}"; do
        n=$(awk '/^(summary|totals):/ { print $2; exit }' "$f")
        n=${n:-0}
        if grep -Eq 'serve_connections|connections::spawn_connection' "$f"; then
            SERVING=$((SERVING + n))
        elif grep -q 'estimate::pool' "$f"; then
            ESTIMATING=$((ESTIMATING + n))
        else
            continue
        fi
        # The outermost tokenizer function on this thread: the largest
        # inclusive cost among tiktoken's (its callees are inside it).
        t=$(callgrind_annotate --inclusive=yes --threshold=100 "$f" 2>/dev/null |
            awk '/tiktoken_rs::/ { gsub(",", "", $1); if ($1 + 0 > m) m = $1 + 0 } END { print m + 0 }')
        TOKENIZER=$((TOKENIZER + t))
    done
}
# One agent turn's figure: $1 requests sent after zeroing the counters.
agent_figure() {
    callgrind_control -z "$VG" >/dev/null
    load "$1"
    sleep 1
    callgrind_control -d "$VG" >/dev/null
    DUMP=$((DUMP + 1))
    sleep 1
    count_dump
    FIGURE=$(((SERVING + ESTIMATING) / $1))
}
if [[ $MODE == agent ]]; then
    # Agent turns (examples/agent_replay): each recorded first turn of
    # tests/fixtures/agent_turns grown to about 15k, 30k and 60k input
    # tokens, sent streamed as the CLI sent it. Each turn gets a gateway
    # of its own: its first request finds the token-count cache cold (the
    # tokenizer counts every string), the next $WARM find it warm (a hash
    # and a look-up per string). The figure is the serving thread's plus
    # the estimation threads'.
    REPLAY=target/$BUILD/examples/agent_replay
    [[ -x $REPLAY ]] || { echo "build first: cargo build --release --bins --examples" >&2; exit 1; }
    WARM=${WARM:-20}
    "$REPLAY" "$TMP/turns" >"$TMP/turns.tsv"
    small() { # $1 API path: the small streamed request of that API
        BODY_FILE=
        case $1 in
            /v1/messages*) dialect messages ;;
            *) dialect responses ;;
        esac
        URL_PATH=$1
    }
    declare -A SMALL SMALL_BYTES
    while IFS=$'\t' read -r name path target tokens bytes steps; do
        start_gateway
        small "$path"
        body_arg
        check_stream
        load 50                            # connections, first-use state
        if [[ -z ${SMALL[$path]:-} ]]; then
            agent_figure 100
            SMALL[$path]=$FIGURE
            SMALL_BYTES[$path]=${#BODY}
            echo "small streamed request on $path (${#BODY} bytes): $FIGURE instructions"
        fi
        BODY_FILE="$TMP/turns/$name"
        body_arg
        agent_figure 1
        COLD=$FIGURE COLD_TOKENIZER=$TOKENIZER
        check_stream                       # the turn came back whole
        agent_figure "$WARM"
        WARM_FIGURE=$FIGURE
        PER_KB=$(( (WARM_FIGURE - SMALL[$path]) * 1024 / (bytes - SMALL_BYTES[$path]) ))
        echo "agent turn $name: $tokens input tokens, $bytes bytes, $steps steps on the recording"
        echo "  cold cache: $COLD instructions (tokenizer $COLD_TOKENIZER, $((COLD_TOKENIZER * 100 / COLD)) %)"
        echo "  warm cache: $WARM_FIGURE instructions per turn over $WARM turns (tokenizer $((TOKENIZER / WARM))); $PER_KB per KB above the small request"
        stop_gateway
    done <"$TMP/turns.tsv"
elif [[ $MODE == stream ]]; then
    for d in $DIALECTS; do
        dialect "$d"
        check_stream
        measure ", $d stream of 64 deltas, max_tokens $CAP"
    done
else
    measure ""
fi
