# Sourced by scripts/image.sh and scripts/compose.sh: podman set up to work
# on a machine that reaches no container registry, and the base images the
# Containerfiles name made locally from Debian's packages.
#
# - podman, buildah, debootstrap, runc (and netavark, aardvark-dns,
#   catatonit) come from Debian's packages (scripts/install-test-deps.sh).
# - CONTAINERS_CONF: the runc runtime, and no default ulimits (podman's
#   default nofile/nproc limits cannot be set inside some sandboxes).
# - docker.io/library/debian:bookworm-slim, the FROM of the Containerfile,
#   is made by `debootstrap --variant=minbase` and tidied as Debian's slim
#   image is (no docs, man pages, locales, apt lists), then `podman import`ed
#   under that name. The root file system's tarball is kept under
#   target/containers/, so a rerun imports it in seconds instead of running
#   debootstrap again (~1 minute). A real debian:bookworm-slim already in
#   podman's store is used as it is.
# - The stand-ins for the official redis and postgres images that
#   deploy/compose.yaml names (tests/containers/*.Containerfile), built on
#   that base from Debian's redis-server and postgresql packages.
#
# Every image made here carries the label org.budgetgate.stand-in=1.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONTAINERS_DIR="$REPO/target/containers"
BASE_IMAGE=docker.io/library/debian:bookworm-slim
REDIS_IMAGE=docker.io/library/redis:7-bookworm
POSTGRES_IMAGE=docker.io/library/postgres:15-bookworm
GATEWAY_IMAGE=localhost/budgetgate:ci

containers_log() { echo "[containers] $*" >&2; }

# podman build, quiet unless it fails (then the end of its output).
containers_build() {
    podman build --quiet "$@" >/dev/null 2>"$CONTAINERS_DIR/build.log" || {
        tail -30 "$CONTAINERS_DIR/build.log" >&2
        containers_log "podman build $* failed"
        return 1
    }
}

# podman and its configuration for this run.
containers_setup() {
    "$REPO/scripts/install-test-deps.sh" containers
    mkdir -p "$CONTAINERS_DIR"
    cat >"$CONTAINERS_DIR/containers.conf" <<'EOF'
# Written by scripts/lib/containers.sh.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
EOF
    export CONTAINERS_CONF="$CONTAINERS_DIR/containers.conf"
}

# A Debian bookworm root file system as Debian's slim image has it.
containers_make_rootfs() { # $1: the tarball to write
    local out=$1 root
    root=$(mktemp -d "$CONTAINERS_DIR/rootfs.XXXXXX")
    containers_log "debootstrap --variant=minbase bookworm (cached as ${out#"$REPO"/} afterwards)"
    # debootstrap's default mirror; DEBIAN_MIRROR picks another.
    if ! debootstrap --variant=minbase bookworm "$root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} \
        >"$CONTAINERS_DIR/debootstrap.log" 2>&1; then
        tail -20 "$CONTAINERS_DIR/debootstrap.log" >&2
        rm -rf "$root"
        return 1
    fi
    # The updates suite beside the release, from the same mirror.
    sed -n 's/^\(deb [^ ]*\) bookworm main$/\1 bookworm-updates main/p' \
        "$root/etc/apt/sources.list" >>"$root/etc/apt/sources.list"
    # As the slim image: packages installed later leave out docs, man pages
    # and locales, and apt keeps no downloaded packages.
    cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
EOF
    printf 'APT::Keep-Downloaded-Packages "false";\n' >"$root/etc/apt/apt.conf.d/docker-clean"
    find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
    rm -rf "$root"/usr/share/{man,info,groff,lintian,locale}/* \
        "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/*.log \
        "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
    tar --numeric-owner -C "$root" -cf "$out.tmp" .
    mv "$out.tmp" "$out"
    rm -rf "$root"
}

# docker.io/library/debian:bookworm-slim in podman's store.
containers_base_image() {
    if podman image exists "$BASE_IMAGE"; then
        return 0
    fi
    local tarball="$CONTAINERS_DIR/debian-bookworm-minbase.tar"
    [ -s "$tarball" ] || containers_make_rootfs "$tarball"
    containers_log "podman import $BASE_IMAGE"
    podman import --quiet \
        --change 'CMD ["bash"]' \
        --change 'LABEL org.budgetgate.stand-in=1' \
        "$tarball" "$BASE_IMAGE" >/dev/null
}

# The redis and postgres images deploy/compose.yaml names, when missing or
# made from another version of their Containerfile (the label
# org.budgetgate.source holds the SHA-256 of the files they are built from).
containers_service_images() {
    containers_base_image
    local sum
    sum=$(cat "$REPO/tests/containers/redis.Containerfile" | sha256sum | cut -c1-16)
    if [ "$(podman image inspect --format '{{index .Labels "org.budgetgate.source"}}' "$REDIS_IMAGE" 2>/dev/null)" != "$sum" ]; then
        containers_log "building the stand-in $REDIS_IMAGE from Debian's redis-server"
        containers_build --format docker -t "$REDIS_IMAGE" --label "org.budgetgate.source=$sum" \
            -f "$REPO/tests/containers/redis.Containerfile" "$REPO/tests/containers"
    fi
    sum=$(cat "$REPO/tests/containers/postgres.Containerfile" "$REPO/tests/containers/postgres-entrypoint.sh" | sha256sum | cut -c1-16)
    if [ "$(podman image inspect --format '{{index .Labels "org.budgetgate.source"}}' "$POSTGRES_IMAGE" 2>/dev/null)" != "$sum" ]; then
        containers_log "building the stand-in $POSTGRES_IMAGE from Debian's postgresql"
        containers_build --format docker -t "$POSTGRES_IMAGE" --label "org.budgetgate.source=$sum" \
            -f "$REPO/tests/containers/postgres.Containerfile" "$REPO/tests/containers"
    fi
}

# The gateway's image around the binary $1: the Containerfile's `prebuilt`
# target, with the binary stripped into a build context of its own.
containers_gateway_image() {
    containers_base_image
    local ctx="$CONTAINERS_DIR/image-context"
    rm -rf "$ctx" && mkdir -p "$ctx"
    cp "$1" "$ctx/budgetgate"
    # The test profile's binary carries debug info, a release one symbols.
    if command -v strip >/dev/null; then strip "$ctx/budgetgate"; fi
    local previous
    previous=$(podman image inspect --format '{{.Id}}' "$GATEWAY_IMAGE" 2>/dev/null || true)
    containers_build --format docker --target prebuilt -t "$GATEWAY_IMAGE" \
        -f "$REPO/Containerfile" "$ctx"
    # The image a new binary replaced would stay behind, untagged, at every run.
    if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$GATEWAY_IMAGE")" ]; then
        podman rmi "$previous" >/dev/null 2>&1 || true
    fi
}

# A free TCP port on the loopback interface.
containers_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until $1 answers HTTP 200, at most $2 seconds.
containers_wait_200() {
    local url=$1 secs=${2:-60} i
    for ((i = 0; i < secs * 5; i++)); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$url" 2>/dev/null)" = 200 ] && return 0
        sleep 0.2
    done
    return 1
}
