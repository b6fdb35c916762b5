#!/usr/bin/env bash
# The release image, tagged <IMAGE>:<version> and <IMAGE>:latest; pushed
# with PUSH=1 (after logging in to the image's registry with REGISTRY_USER
# and REGISTRY_PASSWORD, when given).
#
#   IMAGE=ghcr.io/owner/budgetgate PUSH=1 scripts/release/image.sh   # the release (GitHub Actions)
#   IMAGE_TARGET=prebuilt scripts/release/image.sh                         # the dry run: no toolchain image, no push
#
# IMAGE_TARGET=build (default) is the Containerfile's default target: the gateway
# compiled in the Rust toolchain image (a registry must be reachable).
# IMAGE_TARGET=prebuilt puts the binary of the release archive (target/dist)
# into the same runtime stage, offline. podman, or docker (ENGINE).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
release_check_tag
IMAGE=$(echo "${IMAGE:-localhost/budgetgate}" | tr '[:upper:]' '[:lower:]')
IMAGE_TARGET=${IMAGE_TARGET:-build}
ENGINE=${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
[ -n "${CONTAINERS_CONF:-}" ] || if [ -f target/containers/containers.conf ]; then export CONTAINERS_CONF=$PWD/target/containers/containers.conf; fi
case "$IMAGE_TARGET" in
    build)
        "$ENGINE" build --format docker -t "$IMAGE:$VERSION" -t "$IMAGE:latest" . ;;
    prebuilt)
        archive=$(ls "$DIST"/budgetgate-"$VERSION"-*.tar.gz 2>/dev/null | head -1)
        [ -n "$archive" ] || release_fail "no release archive in $DIST: scripts/release/archive.sh first"
        ctx=$(mktemp -d "${TMPDIR:-/tmp}/budgetgate-image.XXXXXX")
        trap 'rm -rf "$ctx"' EXIT
        tar -xzf "$archive" -C "$ctx" --strip-components=2 --wildcards '*/bin/budgetgate'
        "$ENGINE" build --quiet --format docker --target prebuilt -t "$IMAGE:$VERSION" -t "$IMAGE:latest" \
            -f Containerfile "$ctx" >/dev/null ;;
    *) release_fail "IMAGE_TARGET must be build or prebuilt" ;;
esac
size=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE:$VERSION")
echo "$IMAGE:$VERSION and :latest: $(awk -v b="$size" 'BEGIN { printf "%.1f MB", b / 1e6 }')"
if [ "${PUSH:-0}" = 1 ]; then
    if [ -n "${REGISTRY_PASSWORD:-}" ]; then
        echo "$REGISTRY_PASSWORD" | "$ENGINE" login --username "${REGISTRY_USER:?set REGISTRY_USER}" --password-stdin "${IMAGE%%/*}"
    fi
    "$ENGINE" push "$IMAGE:$VERSION"
    "$ENGINE" push "$IMAGE:latest"
fi
