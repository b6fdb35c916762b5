#!/usr/bin/env bash
# The software bill of materials of the gateway's crate graph, CycloneDX
# JSON, from Cargo.lock: target/dist/budgetgate-<version>.cdx.json.
# cargo-cyclonedx (crates.io, pinned) is installed with `cargo install`
# (into Cargo's bin directory, ~/.cargo/bin, where later runs and other
# clones find it) when missing: about 3 minutes of CPU the first time.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
release_check_tag
CARGO_CYCLONEDX_VERSION=0.5.9
if [ "$(cargo cyclonedx --version 2>/dev/null | awk '{print $NF}')" != "$CARGO_CYCLONEDX_VERSION" ]; then
    echo "installing cargo-cyclonedx $CARGO_CYCLONEDX_VERSION (cargo install)..." >&2
    cargo install --quiet --locked --version "$CARGO_CYCLONEDX_VERSION" cargo-cyclonedx
fi
mkdir -p "$DIST"
cargo cyclonedx --format json --spec-version 1.5 --override-filename budgetgate.cdx >/dev/null
out="$DIST/budgetgate-$VERSION.cdx.json"
mv budgetgate.cdx.json "$out"
python3 - "$out" "$VERSION" <<'PY' || release_fail "$out"
import json, sys
bom = json.load(open(sys.argv[1]))
assert bom["bomFormat"] == "CycloneDX", bom.get("bomFormat")
main = bom["metadata"]["component"]
assert (main["name"], main["version"]) == ("budgetgate", sys.argv[2]), main
names = {c["name"] for c in bom.get("components", [])}
for crate in ("tokio", "axum", "sqlx", "redis"):
    assert crate in names, crate
print(f"{sys.argv[1]}: CycloneDX {bom['specVersion']}, {len(names)} components")
PY
