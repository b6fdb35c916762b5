#!/usr/bin/env bash
# Installs the system tools the tests drive, each only when missing (a no-op
# taking milliseconds when everything is there). Debian/Ubuntu packages via
# apt-get; nothing is downloaded from anywhere else (no browser downloads).
#
#   scripts/install-test-deps.sh [redis] [chromium] [promtool] [postgres] [containers] [node]   (default: all)
#
# redis     redis-server, redis-cli   (tests start their own servers on free ports)
# chromium  /usr/bin/chromium and /usr/bin/chromedriver (the budget page test)
# promtool  promtool, from Debian's `prometheus` package (the deploy/ kit test),
#           installed without starting or enabling its Prometheus server
# postgres  Debian's `postgresql` server binaries (/usr/lib/postgresql/*/bin: initdb,
#           pg_ctl); tests make their own clusters, the package's own cluster is not started
# containers  podman, buildah, debootstrap, runc, netavark, aardvark-dns, catatonit, iptables (the
#           image and compose checks, scripts/image.sh and scripts/compose.sh)
# node      node and npm (Debian's `nodejs`, `npm`): scripts/test.sh installs the pinned
#           coding-agent CLIs with `npm ci` (tests/agents/)
set -euo pipefail

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(redis chromium promtool postgres containers node)

packages=()
for w in "${want[@]}"; do
    case "$w" in
        redis)
            if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
                packages+=(redis-server)
            fi ;;
        chromium)
            [ -x /usr/bin/chromium ] || packages+=(chromium)
            [ -x /usr/bin/chromedriver ] || packages+=(chromium-driver) ;;
        promtool)
            command -v promtool >/dev/null 2>&1 || packages+=(prometheus) ;;
        postgres)
            ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || packages+=(postgresql) ;;
        containers)
            for tool in podman buildah debootstrap runc; do
                command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || packages+=("$tool")
            done
            # podman's network backend with its DNS (compose service names),
            # and the init of a pod's infra container.
            [ -x /usr/lib/podman/netavark ] || packages+=(netavark)
            [ -x /usr/lib/podman/aardvark-dns ] || packages+=(aardvark-dns)
            command -v catatonit >/dev/null 2>&1 || [ -x /usr/libexec/podman/catatonit ] || packages+=(catatonit)
            # netavark sets up a container's network with iptables; without
            # it every RUN step fails "netavark: No such file or directory"
            # (seen on a machine where Debian's netavark came without it).
            command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || packages+=(iptables) ;;
        node)
            command -v node >/dev/null 2>&1 || packages+=(nodejs)
            command -v npm >/dev/null 2>&1 || packages+=(npm) ;;
        *) echo "unknown component: $w" >&2; exit 2 ;;
    esac
done
[ ${#packages[@]} -eq 0 ] && exit 0

echo "installing ${packages[*]} (apt-get)..." >&2
if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-get is unavailable: install ${packages[*]} and retry" >&2
    exit 1
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
# One installer at a time (test binaries may ask in parallel).
exec 9>/tmp/budgetgate-install-test-deps.lock
flock 9

# Debian's `prometheus` package starts a Prometheus server (port 9090) when
# installed on a machine with systemd; the tests need only its promtool. A
# policy-rc.d answering 101 ("action forbidden"), which deb-systemd-invoke
# and invoke-rc.d honour, keeps it from starting; whatever policy-rc.d was
# there before is put back afterwards, also when the install fails.
# POLICY_RC_D exists for the script's own test.
policy_rc_d="${POLICY_RC_D:-/usr/sbin/policy-rc.d}"
policy_saved=""
policy_set=false
restore_policy() {
    $policy_set || return 0
    if [ -n "$policy_saved" ]; then
        $SUDO mv -f "$policy_saved" "$policy_rc_d"
    else
        $SUDO rm -f "$policy_rc_d"
    fi
    policy_set=false
}
installs_service=false
for p in "${packages[@]}"; do
    # Both start a server of their own when installed; the tests need neither.
    case "$p" in prometheus|postgresql) installs_service=true ;; esac
done
if $installs_service; then
    trap restore_policy EXIT
    if [ -e "$policy_rc_d" ]; then
        policy_saved="$($SUDO mktemp "${policy_rc_d}.saved.XXXXXX")"
        $SUDO cp -p "$policy_rc_d" "$policy_saved"
    fi
    policy_set=true
    printf '#!/bin/sh\n# budgetgate install-test-deps.sh: start no service while it installs.\nexit 101\n' \
        | $SUDO tee "$policy_rc_d" >/dev/null
    $SUDO chmod 755 "$policy_rc_d"
fi

$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null

if $installs_service; then
    restore_policy
    # Not at the next boot either. Without systemd there is nothing enabled.
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
        $SUDO systemctl disable --now postgresql.service >/dev/null 2>&1 || true
    fi
    if command -v pgrep >/dev/null 2>&1 && pgrep -x prometheus >/dev/null 2>&1; then
        echo "warning: a prometheus process is running (not started by this script): pgrep -a prometheus" >&2
    fi
fi
