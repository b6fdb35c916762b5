#!/usr/bin/env bash
# Installs the system tools the tests drive, each only when missing (a no-op
# taking milliseconds when everything is there). Debian/Ubuntu packages via
# apt-get; nothing is downloaded from anywhere else (no browser downloads).
#
#   scripts/install-test-deps.sh [redis] [chromium] [promtool]   (default: all)
#
# redis     redis-server, redis-cli   (tests start their own servers on free ports)
# chromium  /usr/bin/chromium and /usr/bin/chromedriver (the budget page test)
# promtool  promtool, from Debian's `prometheus` package (the deploy/ kit test)
set -euo pipefail

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(redis chromium promtool)

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
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
