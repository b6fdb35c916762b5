# Sourced by the release scripts: the version, and where the release's
# files go.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VERSION=$(sed -n '/^\[package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)
DIST=${OUT:-$REPO/target/dist}
release_fail() { echo "$(basename "$0"): FAILED: $*" >&2; exit 1; }
# A tag being released (GitHub's GITHUB_REF_NAME on a tag push) must name
# the version the files carry.
release_check_tag() {
    local tag=${RELEASE_TAG:-}
    [ -z "$tag" ] || [ "$tag" = "v$VERSION" ] || release_fail "tag $tag does not name version $VERSION (Cargo.toml)"
}
