#!/usr/bin/env bash
# Builds budgetgate's container image from the shipped Containerfile with no
# container registry, runs it with podman against the simulated upstream,
# and checks it:
#
#   - /readyz answers 200 and the image's HEALTHCHECK passes;
#   - a chat request is admitted (200), metered (settled tokens in
#     /metrics) and written to the spend ledger in the state volume;
#   - the gateway's process is not root (uid 10001, read from /proc);
#   - SIGTERM drains: a stream in flight finishes whole and the container
#     exits 0 within server.shutdown_grace_secs;
#   - the image holds no compiler (cc, gcc, clang, rustc, cargo, ld, as);
# and prints the image's size.
#
#   scripts/image.sh                 # release binaries: cargo build --release --bins --examples
#   PROFILE=debug scripts/image.sh   # the test build's binaries (what CI uses: see scripts/test.sh)
#   BUDGETGATE_BIN=path MOCK_BIN=path scripts/image.sh
#   KEEP=1 scripts/image.sh          # leave the pod running for a look (removed by the next run)
#
# The image is built with the Containerfile's `prebuilt` target: the runtime
# stage around the binary built beforehand (stripped), tagged
# localhost/budgetgate:ci. The default target, which compiles in a Rust
# toolchain image, needs that image from a registry (see the Containerfile).
# The base image (docker.io/library/debian:bookworm-slim) is made from
# Debian's packages: scripts/lib/containers.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/containers.sh

PROFILE=${PROFILE:-release}
BIN=${BUDGETGATE_BIN:-target/$PROFILE/budgetgate}
MOCK=${MOCK_BIN:-target/$PROFILE/examples/mock_upstream}
IMAGE=$GATEWAY_IMAGE
NAME=budgetgate-image-check
for f in "$BIN" "$MOCK"; do
    [ -x "$f" ] || { echo "image.sh: $f is missing: cargo build --bins --examples${PROFILE/#release/ --release}" >&2; exit 1; }
done

fail() { echo "image.sh: FAILED: $*" >&2; exit 1; }
step_start=$SECONDS
step() { echo "== $* (t=$((SECONDS - step_start))s)"; }

containers_setup
step "base image"
containers_base_image

cleanup() {
    [ "${KEEP:-0}" = 1 ] && { echo "KEEP=1: pod $NAME left running"; return; }
    podman pod rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
    podman volume rm -f "$NAME-state" >/dev/null 2>&1 || true
}
cleanup
trap cleanup EXIT

step "podman build --target prebuilt ($BIN)"
build_t0=$SECONDS
containers_gateway_image "$BIN"
echo "built in $((SECONDS - build_t0)) s"
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
base_size=$(podman image inspect --format '{{.Size}}' "$BASE_IMAGE")
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
echo "image $IMAGE: $(mb "$size") (base $BASE_IMAGE $(mb "$base_size"), binary $(mb "$(stat -c %s "$CONTAINERS_DIR/image-context/budgetgate")") stripped, from $BIN)"

step "the image holds no compiler"
# bash itself must be found: the lookup works, so an empty answer means none.
found=$(podman run --rm --no-healthcheck --entrypoint bash "$IMAGE" -c \
    'for c in bash cc c++ gcc g++ clang rustc cargo ld as; do command -v "$c"; done; ls -d /usr/lib/gcc /usr/local/cargo /usr/local/rustup 2>/dev/null; true' \
    2>>"$CONTAINERS_DIR/podman.log")
[ "$found" = /usr/bin/bash ] || fail "compiler found in the image (or no bash): $found"
echo "none of cc, c++, gcc, g++, clang, rustc, cargo, ld, as"
[ "$(podman image inspect --format '{{.Config.User}}' "$IMAGE")" = "10001:10001" ] || fail "the image's USER is not 10001"
podman image inspect --format '{{.Config.Healthcheck}}' "$IMAGE" | grep -q healthz || fail "the image has no HEALTHCHECK on /healthz"

step "pod: simulated upstream + gateway (config/local.toml mounted, state in a volume)"
port=$(containers_free_port)
admin=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
podman volume create "$NAME-state" >/dev/null
podman pod create --name "$NAME" -p "127.0.0.1:$port:8080" >/dev/null
# The upstream streams a token every 20 ms: the drain check below keeps a
# stream in flight across the SIGTERM.
podman run -d --init --pod "$NAME" --name "$NAME-upstream" \
    -v "$PWD/$MOCK:/usr/local/bin/mock_upstream:ro" "$BASE_IMAGE" \
    mock_upstream --listen 127.0.0.1:9000 --token-delay-ms 20 --output-tokens 100 >/dev/null 2>>"$CONTAINERS_DIR/podman.log"
podman run -d --pod "$NAME" --name "$NAME-gateway" \
    -v "$PWD/config/local.toml:/etc/budgetgate/budgetgate.toml:ro" \
    -v "$NAME-state:/var/lib/budgetgate" \
    -e BUDGETGATE_ADMIN_TOKEN="$admin" \
    --health-interval disable \
    "$IMAGE" >/dev/null 2>>"$CONTAINERS_DIR/podman.log"
# (podman logs that it has no systemd for healthcheck timers: the
# HEALTHCHECK is run by hand below.)
base="http://127.0.0.1:$port"
containers_wait_200 "$base/readyz" 60 || { podman logs "$NAME-gateway" | tail -20; fail "/readyz not 200 within 60 s"; }
echo "/readyz: $(curl -s "$base/readyz")"
podman healthcheck run "$NAME-gateway" >/dev/null || fail "the HEALTHCHECK failed"
echo "HEALTHCHECK: healthy"

step "the gateway's process is not root"
pid=$(podman inspect --format '{{.State.Pid}}' "$NAME-gateway")
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
[ "$uid" = 10001 ] || fail "the gateway runs as uid $uid"
echo "uid of $(tr '\0' ' ' <"/proc/$pid/cmdline"): $uid"

step "a chat request, admitted and metered"
chat() {
    curl -s -o "$1" -w '%{http_code}' "$base/v1/chat/completions" \
        -H "Authorization: Bearer sk-local-demo" -H "Content-Type: application/json" -d "$2"
}
out="$CONTAINERS_DIR/image-check.out"
code=$(chat "$out" '{"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "Hello!"}]}')
[ "$code" = 200 ] || fail "chat answered $code: $(cat "$out")"
total=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["total_tokens"])' "$out")
settled=""
for _ in $(seq 1 50); do
    settled=$(curl -s "$base/metrics" | awk '/^budgetgate_settled_tokens_total\{.*tenant="demo"/ {print $2}')
    [ -n "$settled" ] && [ "${settled%.*}" -gt 0 ] && break
    sleep 0.1
done
[ "${settled%.*}" = "$total" ] || fail "settled tokens of demo: '$settled', the answer's usage: $total"
echo "200, usage $total tokens; budgetgate_settled_tokens_total{tenant=\"demo\"} = $settled"
rows=""
for _ in $(seq 1 50); do
    rows=$(curl -s -H "Authorization: Bearer $admin" "$base/admin/v1/spend/rows?tenant=demo" |
        python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]))' 2>/dev/null || true)
    [ "$rows" = 1 ] && break
    sleep 0.2
done
[ "$rows" = 1 ] || fail "spend ledger rows of demo: '$rows', want 1"
echo "spend ledger (SQLite in the state volume): 1 row"

step "SIGTERM drains a stream in flight and exits 0 within the grace"
grace=30 # server.shutdown_grace_secs, unset in config/local.toml
stream="$CONTAINERS_DIR/image-check.stream"
curl -s -N -o "$stream" -w '%{http_code}' "$base/v1/chat/completions" \
    -H "Authorization: Bearer sk-local-demo" -H "Content-Type: application/json" \
    -d '{"model": "gpt-4o-mini", "max_tokens": 200, "stream": true, "messages": [{"role": "user", "content": "Hello!"}]}' \
    >"$stream.code" &
curl_pid=$!
# The stream's first tokens have arrived: it is in flight.
for _ in $(seq 1 100); do grep -q '"content"' "$stream" 2>/dev/null && break; sleep 0.05; done
grep -q '"content"' "$stream" || fail "the stream did not start"
t0=$(date +%s%N)
podman kill --signal TERM "$NAME-gateway" >/dev/null
status=$(timeout $((grace + 15)) podman wait "$NAME-gateway") || fail "still running $((grace + 15)) s after SIGTERM"
took_ms=$((($(date +%s%N) - t0) / 1000000))
wait "$curl_pid" || true
[ "$status" = 0 ] || { podman logs "$NAME-gateway" | tail -20; fail "exit status $status after SIGTERM"; }
((took_ms < grace * 1000)) || fail "took $took_ms ms to exit, grace ${grace} s"
# Cut off at the deadline it would end with finish_reason "length".
[ "$(cat "$stream.code")" = 200 ] && grep -q '"finish_reason":"stop"' "$stream" && tail -c 200 "$stream" | grep -q 'data: \[DONE\]' \
    || fail "the stream in flight was not finished: $(tail -c 300 "$stream")"
tokens=$(grep -c '"content"' "$stream" || true)
echo "exit status 0, $took_ms ms after SIGTERM; the stream in flight got its $tokens tokens, finish_reason stop and [DONE]"
logs=$(podman logs "$NAME-gateway" 2>&1)
echo "$logs" | grep -q '"level":"INFO"' || fail "no JSON log lines (BUDGETGATE_LOG_JSON): $(echo "$logs" | tail -3)"

step "the state volume"
vol=$(podman volume inspect --format '{{.Mountpoint}}' "$NAME-state")
ls -ln "$vol" | awk 'NR > 1 {print "  " $3 ":" $4, $NF}'
[ -s "$vol/memory-store.json" ] && [ -s "$vol/control.db" ] || fail "no snapshot or control database in the state volume"
[ "$(stat -c %u "$vol/memory-store.json")" = 10001 ] || fail "the snapshot is not owned by uid 10001"

step "the default target: the toolchain stage, then the runtime (on a stand-in crate)"
# The real toolchain stage is a release build of the gateway (~10 minutes
# of both cores) in docker.io/library/rust, which no registry here serves:
# the same stages are built on a crate that prints its arguments, with a
# stand-in toolchain image (Debian's gcc, the host's Rust mounted), so that
# a broken build stage, cache mount, strip or COPY --from fails here.
sysroot=$(rustc --print sysroot)
rust_image=localhost/budgetgate-ci-rust
podman image exists "$rust_image" ||
    containers_build -t "$rust_image" -f tests/containers/rust.Containerfile tests/containers
crate="$CONTAINERS_DIR/stand-in-crate"
rm -rf "$crate" && mkdir -p "$crate/src"
cp Containerfile "$crate/"
printf '[package]\nname = "budgetgate"\nversion = "0.0.0"\nedition = "2021"\n' >"$crate/Cargo.toml"
echo 'fn main() { println!("stand-in {}", std::env::args().skip(1).collect::<Vec<_>>().join(" ")); }' >"$crate/src/main.rs"
(cd "$crate" && cargo generate-lockfile --offline -q)
containers_build --format docker --build-arg RUST_IMAGE="$rust_image" \
    -v "$sysroot:/usr/local/rust:ro" -t localhost/budgetgate-ci-default-target "$crate" ||
    fail "the default target does not build"
said=$(podman run --rm --no-healthcheck localhost/budgetgate-ci-default-target 2>>"$CONTAINERS_DIR/podman.log")
[ "$said" = "stand-in serve --listen 0.0.0.0:8080" ] || fail "the default target's image ran: '$said'"
[ "$(podman image inspect --format '{{.Config.User}}' localhost/budgetgate-ci-default-target)" = 10001:10001 ] ||
    fail "the default target's image does not run as 10001"
podman rmi localhost/budgetgate-ci-default-target >/dev/null
echo "built (USER 10001); it ran: $said"

step "passed"
