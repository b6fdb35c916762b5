#!/usr/bin/env bash
# Makes the release archive budgetgate-<version>-<target>.tar.gz and its
# SHA-256, in target/dist/:
#
#   budgetgate-<version>-<target>/
#     bin/budgetgate            the gateway (stripped)
#     bin/mock_upstream         the simulated upstream the example configs use
#     config/                   the example configs (config/*.toml)
#     deploy/                   systemd unit, Kubernetes manifests, Grafana dashboard, Prometheus alerts and
#                               recording rules, compose fleet (compose.yaml, fleet.toml)
#     Containerfile             its `prebuilt` target makes the image from bin/budgetgate
#     docs/, README.md, LICENSE
#     BUILD-INFO                version, target, commit, profile, rustc
#
#   scripts/package.sh                 # from the release build: cargo build --release --bins --examples
#   PROFILE=debug scripts/package.sh   # from the test build (CI checks the archive's layout with it)
#   OUT=dir scripts/package.sh
#
# The archive is reproducible for a given commit and binaries: files sorted,
# owned by 0:0, dated at the commit. Install from it: README.md, "Install
# from a release archive"; scripts/archive-check.sh runs those commands.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-release}
BIN=${BUDGETGATE_BIN:-target/$PROFILE/budgetgate}
MOCK=${MOCK_BIN:-target/$PROFILE/examples/mock_upstream}
OUT=${OUT:-target/dist}
for f in "$BIN" "$MOCK"; do
    [ -x "$f" ] || { echo "package.sh: $f is missing: cargo build --bins --examples${PROFILE/#release/ --release}" >&2; exit 1; }
done

version=$(sed -n '/^\[package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
target=${TARGET:-$(rustc -vV | sed -n 's/^host: //p')}
[ -n "$version" ] && [ -n "$target" ] || { echo "package.sh: no version or target" >&2; exit 1; }
name="budgetgate-$version-$target"

stage=$(mktemp -d "${TMPDIR:-/tmp}/budgetgate-package.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/$name"
mkdir -p "$root/bin" "$root/config" "$root/deploy" "$root/docs"

install -m 0755 "$BIN" "$root/bin/budgetgate"
install -m 0755 "$MOCK" "$root/bin/mock_upstream"
if command -v strip >/dev/null; then strip "$root/bin/budgetgate" "$root/bin/mock_upstream"; fi
install -m 0644 config/*.toml "$root/config/"
cp -R deploy/grafana deploy/prometheus deploy/systemd deploy/kubernetes "$root/deploy/"
install -m 0644 deploy/compose.yaml deploy/fleet.toml "$root/deploy/"
install -m 0644 docs/*.md docs/*.json docs/*.png "$root/docs/"
install -m 0644 README.md LICENSE Containerfile "$root/"
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
{
    echo "version: $version"
    echo "target: $target"
    echo "commit: $commit"
    echo "profile: $PROFILE"
    echo "rustc: $(rustc -V)"
    # The newest glibc symbol version the gateway links: the oldest glibc it runs on.
    if command -v objdump >/dev/null; then
        echo "glibc: >= $(objdump -T "$root/bin/budgetgate" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)"
    fi
} >"$root/BUILD-INFO"
find "$root" -type d -exec chmod 0755 {} +

# Dated at the commit (or now, outside git): the same inputs, the same bytes.
epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
mkdir -p "$OUT"
archive="$OUT/$name.tar.gz"
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    -C "$stage" -cf - "$name" | gzip -9n >"$archive.tmp"
mv "$archive.tmp" "$archive"
(cd "$OUT" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
size=$(stat -c %s "$archive")
echo "$archive ($(awk -v b="$size" 'BEGIN { printf "%.1f MB", b / 1e6 }'), $PROFILE build)"
cat "$archive.sha256"
