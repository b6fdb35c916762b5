#!/usr/bin/env bash
# The Kubernetes fleet run as pods with `podman kube play`: the CI-only
# overlay tests/kubernetes/podman (overlays/fleet with the stores, two
# single-replica gateway Deployments, the simulated upstream), rendered
# with kubectl kustomize and played on a DNS-enabled podman network this
# script creates, then checked:
#
#   - both gateways answer /readyz (on 127.0.0.1, their hostPorts);
#   - a tenant and a key made through gateway A are used through gateway B
#     (the control plane on PostgreSQL);
#   - one daily budget is shared exactly: 6 requests a day, 3 through A and
#     3 through B, the 7th refused on either (budgets on Redis);
#   - the ledger's rows are on PostgreSQL, read through B;
# then tears it down (`podman kube down`, the volumes, the secret and the
# network) and checks that no pod, volume or network of it is left.
#
#   PROFILE=debug scripts/kube-play.sh   # the test build's binaries (CI)
#   KEEP=1 scripts/kube-play.sh          # leave the pods up for a look
#
# Podman has no Services: each store and the upstream is played on its own
# with its Service's name as its network alias (`--network NET:alias=NAME`),
# so the fleet's config reaches them by the names a cluster gives them.
# The Secret budgetgate is a podman secret (what `secretKeyRef` reads under
# podman: a JSON object of base64 values), made here with random values.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/containers.sh
source scripts/lib/kubernetes-tools.sh

PROFILE=${PROFILE:-release}
BIN=${BUDGETGATE_BIN:-target/$PROFILE/budgetgate}
MOCK=${MOCK_BIN:-target/$PROFILE/examples/mock_upstream}
NET=budgetgate-kube-play
WORK=target/kubernetes/kube-play
for f in "$BIN" "$MOCK"; do
    [ -x "$f" ] || { echo "kube-play.sh: $f is missing: cargo build --bins --examples${PROFILE/#release/ --release}" >&2; exit 1; }
done
# The played pods, each with the alias it is reached by (none for the
# gateways, reached on their published ports).
PARTS=(budgetgate-redis budgetgate-postgres upstream budgetgate budgetgate-b)

fail() {
    echo "kube-play.sh: FAILED: $*" >&2
    for p in budgetgate budgetgate-b budgetgate-postgres; do
        echo "--- logs of $p" >&2
        podman logs --tail 15 "$p-pod-0-${p%-b}" >&2 2>&1 || podman pod logs --tail 15 "$p-pod-0" >&2 2>&1 || true
    done
    exit 1
}
step_start=$SECONDS
step() { echo "== $* (t=$((SECONDS - step_start))s)"; }

containers_setup
kubernetes_tools
step "images"
containers_service_images
containers_gateway_image "$BIN"

leftovers() {
    podman pod ls --format '{{.Name}}' | grep -E '^(budgetgate|upstream)' || true
    podman volume ls --format '{{.Name}}' | grep -E '^budgetgate-(redis|postgres)$' || true
    podman network ls --format '{{.Name}}' | grep -x "$NET" || true
    podman secret ls --format '{{.Name}}' | grep -x budgetgate || true
}
down() { # [force]: no graceful stop (after a failure)
    local i part
    # The gateways first, the stores last (a stack's order).
    for ((i = ${#PARTS[@]} - 1; i >= 0; i--)); do
        part=${PARTS[$i]}
        if [ "${1:-}" = force ]; then
            podman pod rm -f -t 0 "$part-pod-0" >/dev/null 2>&1 || true
        elif [ -f "$WORK/$part.yaml" ]; then
            podman kube down "$WORK/$part.yaml" >/dev/null 2>&1 || true
        fi
    done
    podman volume rm -f budgetgate-redis budgetgate-postgres >/dev/null 2>&1 || true
    podman secret rm budgetgate >/dev/null 2>&1 || true
    podman network rm -f "$NET" >/dev/null 2>&1 || true
}
cleanup() {
    [ "${KEEP:-0}" = 1 ] && { echo "KEEP=1: the pods are left up (network $NET)"; return; }
    down force
}

step "render tests/kubernetes/podman (kubectl kustomize), one file per pod"
rm -rf "$WORK" && mkdir -p "$WORK"
"$KUBECTL" kustomize tests/kubernetes/podman >"$WORK/podman.yaml" || fail "kubectl kustomize"
A_PORT=$(containers_free_port) B_PORT=$(containers_free_port)
# One file per Deployment, with the ConfigMap and the volume claims it
# uses; the placeholders of the overlay filled in (the ports, the mock's path).
"$KUBERNETES_VENV/bin/python" - "$WORK" "$A_PORT" "$B_PORT" "$PWD/$MOCK" <<'PY' || fail "split"
import sys, yaml
work, a_port, b_port, mock = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
docs = [d for d in yaml.safe_load_all(open(f"{work}/podman.yaml")) if d]
by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
ports = {"budgetgate": a_port, "budgetgate-b": b_port}
for d in docs:
    if d["kind"] != "Deployment":
        continue
    name = d["metadata"]["name"]
    spec = d["spec"]["template"]["spec"]
    for c in spec["containers"]:
        for p in c.get("ports", []):
            if "hostPort" in p:
                p["hostPort"] = ports[name]
    parts = []
    for v in spec.get("volumes", []):
        if "configMap" in v:
            parts.append(by[("ConfigMap", v["configMap"]["name"])])
        if "persistentVolumeClaim" in v:
            parts.append(by[("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])])
        if v.get("hostPath", {}).get("path") == "/MOCK_UPSTREAM_BIN":
            v["hostPath"]["path"] = mock
    parts.append(d)
    yaml.safe_dump_all(parts, open(f"{work}/{name}.yaml", "w"), sort_keys=False)
PY
ls "$WORK"

down force # what an interrupted run left
trap cleanup EXIT
step "podman kube play on network $NET"
podman network create "$NET" >/dev/null
ADMIN_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
"$KUBERNETES_VENV/bin/python" - "$WORK/secret.json" "$ADMIN_TOKEN" <<'PY'
import base64, json, os, sys
b64 = lambda s: base64.b64encode(s.encode()).decode()
json.dump({"admin-token": b64(sys.argv[2]),
           "openai-api-key": b64("sk-unused-by-the-simulated-upstream"),
           "postgres-password": b64(os.urandom(24).hex())}, open(sys.argv[1], "w"))
PY
podman secret create budgetgate "$WORK/secret.json" >/dev/null
rm -f "$WORK/secret.json"
play() { # part [alias]
    podman kube play --network "$NET${2:+:alias=$2}" "$WORK/$1.yaml" >"$WORK/$1.play.log" 2>&1 \
        || { cat "$WORK/$1.play.log" >&2; fail "podman kube play $1"; }
}
play budgetgate-redis budgetgate-redis
play budgetgate-postgres budgetgate-postgres
play upstream upstream
play budgetgate
play budgetgate-b
A=http://127.0.0.1:$A_PORT
B=http://127.0.0.1:$B_PORT
# A gateway started before PostgreSQL accepts connections exits; the pod
# restarts it (restartPolicy Always).
for g in "$A" "$B"; do
    containers_wait_200 "$g/readyz" 120 || fail "$g/readyz not 200 within 120 s"
done
echo "gateway A $A and gateway B $B ready: $(curl -s "$A/readyz")"
podman pod ls --format '{{.Name}} {{.Status}}' | grep -E '^(budgetgate|upstream)' | sort

admin() { # method url [json]
    curl -s -X "$1" -H "Authorization: Bearer $ADMIN_TOKEN" -H "Content-Type: application/json" \
        ${3:+-d "$3"} "$2"
}
chat() { # base key
    curl -s -o /dev/null -w '%{http_code}' "$1/v1/chat/completions" \
        -H "Authorization: Bearer $2" -H "Content-Type: application/json" \
        -d '{"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}'
}
json() { python3 -c "import json,sys; d = json.load(sys.stdin); print($1)"; }

step "a tenant and a key made through A, used through B"
admin POST "$A/admin/v1/tenants" '{"name": "ci-kube", "limits": {"requests_per_day": 6, "rpm": 600}}' | json 'd["name"]' >/dev/null \
    || fail "tenant creation through A"
key=$(admin POST "$A/admin/v1/tenants/ci-kube/keys" '{"alias": "made through A"}' | json 'd["secret"]') \
    || fail "key creation through A"
code=""
for _ in $(seq 1 50); do
    code=$(chat "$B" "$key")
    [ "$code" = 200 ] && break
    sleep 0.1
done
[ "$code" = 200 ] || fail "the key made through A answers $code through B"

step "one daily budget across both gateways (requests_per_day = 6)"
codes="B:200"
for g in A A A B B; do
    base=$A; [ $g = B ] && base=$B
    codes+=" $g:$(chat "$base" "$key")"
done
codes+=" A:$(chat "$A" "$key") B:$(chat "$B" "$key")"
echo "$codes"
[ "$codes" = "B:200 A:200 A:200 A:200 B:200 B:200 A:429 B:429" ] || fail "want 6 answered across the fleet, then 429 on both"

step "the ledger's rows on PostgreSQL, read through B"
requests=""
for _ in $(seq 1 50); do
    requests=$(admin GET "$B/admin/v1/spend?tenant=ci-kube&group_by=tenant" | json 'sum(r["requests"] for r in d["data"])' 2>/dev/null || true)
    [ "$requests" = 6 ] && break
    sleep 0.2
done
[ "$requests" = 6 ] || fail "the ledger read through B counts '$requests' requests of ci-kube, want 6"
echo "6 requests of ci-kube in the ledger"

step "podman kube down"
t0=$(date +%s%N)
trap - EXIT
down
echo "down in $((($(date +%s%N) - t0) / 1000000)) ms"
left=$(leftovers)
[ -z "$left" ] || fail "left after down: $left"
echo "no pod, volume, secret or network of the fleet is left"
step "passed"
