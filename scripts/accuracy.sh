#!/usr/bin/env bash
# The enforcement-accuracy benchmark (docs/ACCURACY.md): real
# gateway processes, redis-servers and the mock upstream on loopback ports,
# driven through bursts and faults (examples/accuracy/). Each scenario's
# figures are read from the mock upstream's own counters, never from the
# gateways, and checked against the bounds of docs/DESIGN.md; it prints the
# table and exits non-zero when a scenario is invalid or a bound is broken.
# Timings are printed, never asserted.
#
#   scripts/accuracy.sh                 # release build, every variant
#   QUICK=1 scripts/accuracy.sh         # one variant of each scenario (CI)
#   PROFILE=debug scripts/accuracy.sh   # the debug binaries
#   BUILD=0 ...                         # use the binaries already built
#   SCENARIOS=burst,reload ...          # some scenarios only
#   PEER_URL=http://127.0.0.1:4000/v1 PEER_KEY=sk-… [PEER_CONFIG_HOOK='…'] \
#     scripts/accuracy.sh               # also drive another gateway through the
#                                       # burst (its upstream: the mock, which
#                                       # the hook points it at; printed only,
#                                       # nothing installed or downloaded)
#
# Needs redis-server (scripts/install-test-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-release}
if [ "${BUILD:-1}" = 1 ]; then
    if [ "$PROFILE" = release ]; then
        cargo build --release --bins --examples
    else
        cargo build --bins --examples
    fi
fi
command -v redis-server >/dev/null || { echo "accuracy.sh: needs redis-server (scripts/install-test-deps.sh)" >&2; exit 2; }
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit (+ uncommitted changes)"
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs || true)
echo "commit $commit; $(nproc) cores ($cpu), $(uname -sr); PROFILE=$PROFILE${QUICK:+ QUICK=$QUICK}; $(redis-server --version | cut -d' ' -f3)"
start=$SECONDS
status=0
"target/$PROFILE/examples/accuracy" || status=$?
echo "accuracy.sh: $((SECONDS - start)) s after the build (PROFILE=$PROFILE${QUICK:+, QUICK=$QUICK}), exit $status"
exit "$status"
