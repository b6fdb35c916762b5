#!/usr/bin/env bash
# The CI check of deploy/compose.yaml: brings the fleet up with
# podman-compose (two gateways, Redis, PostgreSQL, plus the simulated
# upstream of tests/containers/compose.ci.yaml), then checks:
#
#   - both gateways answer /readyz, and every service's healthcheck passes;
#   - a tenant and a key created through gateway A are served by gateway B
#     (the control plane on PostgreSQL), within the second CONTROL.md promises;
#   - traffic through both gateways spends one budget: a tenant allowed 6
#     requests a day gets 3 through A and 3 through B, the 7th is refused on
#     either (budgets on Redis);
#   - the spend ledger read through B holds the rows both gateways wrote;
#   - quota leases are on: a burst on one budget is served from leases
#     (budgetgate_quota_lease_decisions_total{decided_by="lease"} > 0);
# then tears the fleet down (`down -v`) and checks that nothing of it is left:
# no container, pod, volume or network of the project.
#
#   scripts/compose.sh                 # release binaries
#   PROFILE=debug scripts/compose.sh   # the test build's binaries (CI)
#   KEEP=1 scripts/compose.sh          # leave the fleet up for a look
#
# The gateway image is built as scripts/image.sh builds it (the
# Containerfile's `prebuilt` target); the Redis and PostgreSQL images are
# stand-ins made from Debian's packages (scripts/lib/containers.sh).
# podman-compose comes from PyPI into .venv (pinned below).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/containers.sh

PODMAN_COMPOSE_VERSION=1.6.0
PROFILE=${PROFILE:-release}
BIN=${BUDGETGATE_BIN:-target/$PROFILE/budgetgate}
MOCK=${MOCK_BIN:-target/$PROFILE/examples/mock_upstream}
PROJECT=budgetgate-compose-check
for f in "$BIN" "$MOCK"; do
    [ -x "$f" ] || { echo "compose.sh: $f is missing: cargo build --bins --examples${PROFILE/#release/ --release}" >&2; exit 1; }
done

fail() {
    echo "compose.sh: FAILED: $*" >&2
    for c in gateway-a gateway-b; do
        echo "--- logs of $c" >&2
        podman logs --tail 15 "${PROJECT}_${c}_1" >&2 2>&1 || true
    done
    exit 1
}
step_start=$SECONDS
step() { echo "== $* (t=$((SECONDS - step_start))s)"; }

containers_setup
step "images"
containers_service_images
containers_gateway_image "$BIN"

if [ ! -x .venv/bin/podman-compose ] || [ "$(.venv/bin/podman-compose --version 2>/dev/null | head -1)" != "podman-compose version $PODMAN_COMPOSE_VERSION" ]; then
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check "podman-compose==$PODMAN_COMPOSE_VERSION"
fi

export BUDGETGATE_IMAGE=$GATEWAY_IMAGE
export BUDGETGATE_ADMIN_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export POSTGRES_PASSWORD=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export OPENAI_API_KEY=sk-unused-by-the-simulated-upstream
export GATEWAY_A_PORT=$(containers_free_port) GATEWAY_B_PORT=$(containers_free_port)
export MOCK_UPSTREAM_BIN=$PWD/$MOCK
# The shipped fleet config, its upstream pointed at the simulated one.
export BUDGETGATE_FLEET_CONFIG=$CONTAINERS_DIR/fleet-ci.toml
sed 's|^base_url = "https://api.openai.com/v1"|base_url = "http://upstream:9000/v1"|' deploy/fleet.toml >"$BUDGETGATE_FLEET_CONFIG"
grep -q '^base_url = "http://upstream:9000/v1"' "$BUDGETGATE_FLEET_CONFIG" || fail "deploy/fleet.toml has no OpenAI base_url line to point at the simulated upstream"

compose() {
    .venv/bin/podman-compose -p "$PROJECT" -f deploy/compose.yaml -f tests/containers/compose.ci.yaml "$@"
}
leftovers() {
    local label="io.podman.compose.project=$PROJECT"
    podman ps -a --filter "label=$label" --format '{{.Names}}'
    podman pod ls --filter "label=$label" --format '{{.Name}}'
    podman volume ls --filter "label=$label" --format '{{.Name}}'
    podman network ls --filter "label=$label" --format '{{.Name}}'
}
down() {
    compose down -v -t 45 >"$CONTAINERS_DIR/compose-down.log" 2>&1
}
cleanup() {
    [ "${KEEP:-0}" = 1 ] && { echo "KEEP=1: the fleet is left up (project $PROJECT)"; return; }
    down || true
}
down || true # what an interrupted run left
trap cleanup EXIT

step "podman-compose up"
# podman-compose prints every container id and podman's complaints about
# systemd (healthcheck timers need it; run by hand below).
compose up -d >"$CONTAINERS_DIR/compose-up.log" 2>&1 || { tail -20 "$CONTAINERS_DIR/compose-up.log" >&2; fail "up"; }
A=http://127.0.0.1:$GATEWAY_A_PORT
B=http://127.0.0.1:$GATEWAY_B_PORT
# podman < 4.6 ignores depends_on's service_healthy: a gateway started before
# PostgreSQL accepts connections exits and is restarted (restart: unless-stopped).
for g in "$A" "$B"; do
    containers_wait_200 "$g/readyz" 120 || fail "$g/readyz not 200 within 120 s"
done
echo "gateway A $A and gateway B $B ready: $(curl -s "$A/readyz")"
for s in redis postgres gateway-a gateway-b; do
    podman healthcheck run "${PROJECT}_${s}_1" >/dev/null || fail "the healthcheck of $s failed"
done
echo "healthchecks of redis, postgres, gateway-a, gateway-b: healthy"

admin() { # method url [json]
    curl -s -X "$1" -H "Authorization: Bearer $BUDGETGATE_ADMIN_TOKEN" -H "Content-Type: application/json" \
        ${3:+-d "$3"} "$2"
}
chat() { # base key
    curl -s -o /dev/null -w '%{http_code}' "$1/v1/chat/completions" \
        -H "Authorization: Bearer $2" -H "Content-Type: application/json" \
        -d '{"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}'
}
json() { python3 -c "import json,sys; d = json.load(sys.stdin); print($1)"; }

step "a tenant and a key created through A, used through B"
admin POST "$A/admin/v1/tenants" '{"name": "ci-fleet", "limits": {"requests_per_day": 6, "rpm": 600}}' | json 'd["name"]' >/dev/null \
    || fail "tenant creation through A"
key=$(admin POST "$A/admin/v1/tenants/ci-fleet/keys" '{"alias": "made through A"}' | json 'd["secret"]') \
    || fail "key creation through A"
t0=$(date +%s%N)
code="" tries=""
for _ in $(seq 1 50); do
    code=$(chat "$B" "$key")
    tries+="$code "
    [ "$code" = 200 ] && break
    sleep 0.1
done
[ "$code" = 200 ] || fail "the key made through A answers $code through B"
echo "the key made through A, used through B: $tries(200 after $((($(date +%s%N) - t0) / 1000000)) ms)"

step "one budget across both gateways (requests_per_day = 6)"
codes="B:200"
for g in A A A B B; do
    base=$A; [ $g = B ] && base=$B
    codes+=" $g:$(chat "$base" "$key")"
done
codes+=" A:$(chat "$A" "$key") B:$(chat "$B" "$key")"
echo "$codes"
[ "$codes" = "B:200 A:200 A:200 A:200 B:200 B:200 A:429 B:429" ] || fail "want 6 answered across the fleet, then 429 on both"

step "the spend ledger on PostgreSQL, read through B"
requests=""
for _ in $(seq 1 50); do
    requests=$(admin GET "$B/admin/v1/spend?tenant=ci-fleet&group_by=tenant" | json 'sum(r["requests"] for r in d["data"])' 2>/dev/null || true)
    [ "$requests" = 6 ] && break
    sleep 0.2
done
[ "$requests" = 6 ] || fail "the ledger read through B counts '$requests' requests of ci-fleet, want 6"
echo "6 requests of ci-fleet in the ledger (3 written by each gateway)"

step "quota leases: a burst on one budget"
admin POST "$A/admin/v1/tenants" '{"name": "ci-burst", "limits": {"rpm": 100000, "tpm": 50000000}}' >/dev/null
burst_key=$(admin POST "$A/admin/v1/tenants/ci-burst/keys" '{}' | json 'd["secret"]') || fail "key creation"
until [ "$(chat "$B" "$burst_key")" = 200 ]; do sleep 0.1; done
cfg="$CONTAINERS_DIR/burst.curl"
: >"$cfg"
echo '{"model": "gpt-4o-mini", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}' >"$cfg.body"
for i in $(seq 1 300); do
    # One transfer per block; `next` keeps each block's options to itself.
    [ "$i" = 1 ] || echo next >>"$cfg"
    printf '%s\n' "url = \"$A/v1/chat/completions\"" \
        "header = \"Authorization: Bearer $burst_key\"" \
        'header = "Content-Type: application/json"' \
        "data-binary = \"@$cfg.body\"" \
        'output = "/dev/null"' 'write-out = "%{http_code}\\n"' >>"$cfg"
done
t0=$(date +%s%N)
codes=$(curl -s --no-progress-meter --parallel --parallel-max 16 -K "$cfg" 2>/dev/null | sort | uniq -c | awk '{printf "%s%s x %s", sep, $2, $1; sep = ", "}')
answered=$(echo "$codes" | sed -n 's/.*200 x \([0-9]*\).*/\1/p')
ms=$((($(date +%s%N) - t0) / 1000000))
leased=$(curl -s "$A/metrics" | awk '/^budgetgate_quota_lease_decisions_total\{.*decided_by="lease"/ {s += $2} END {print s + 0}')
echo "300 requests in $ms ms through A: $codes; decided from a lease: $leased"
[ "$answered" = 300 ] || fail "$answered of 300 burst requests answered 200"
[ "${leased%.*}" -gt 0 ] || fail "no decision was taken from a lease"

step "podman-compose down -v"
t0=$(date +%s%N)
down || { tail -20 "$CONTAINERS_DIR/compose-down.log" >&2; fail "down"; }
echo "down in $((($(date +%s%N) - t0) / 1000000)) ms"
left=$(leftovers)
[ -z "$left" ] || fail "left after down: $left"
echo "nothing of project $PROJECT is left (containers, pods, volumes, networks)"
trap - EXIT
step "passed"
