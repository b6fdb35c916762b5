#!/usr/bin/env bash
# The release archive as a user meets it: copies
# target/dist/budgetgate-<version>-<target>.tar.gz and its .sha256 into an
# empty directory and runs the README's commands of "Install from a release
# archive" there, as written: the blocks marked <!-- archive-check: NAME -->
# (install; the simulated upstream and the gateway, each in the background
# as in a terminal of its own; the request to try), then checks that the
# request was answered 200 and metered.
#
#   scripts/package.sh && scripts/archive-check.sh
#   PROFILE=debug scripts/package.sh && scripts/archive-check.sh
#
# Two changes to what a user runs, both ones the README itself describes:
# free ports instead of 8080 and 9000 ("If a port is taken, pick others"),
# and the state directory in the test's directory (XDG_STATE_HOME), so that
# the check neither meets nor touches a gateway the user runs.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DIST=${OUT:-target/dist}

fail() { echo "archive-check.sh: FAILED: $*" >&2; exit 1; }

# The README's block after the marker <!-- archive-check: $1 -->.
block() {
    awk -v want="<!-- archive-check: $1 -->" '
        $0 == want { armed = 1; next }
        armed && /^```/ { if (inside) exit; inside = 1; next }
        inside { print }
    ' README.md
}
declare -A blocks
for b in install upstream gateway try; do
    blocks[$b]=$(block "$b")
    [ -n "${blocks[$b]}" ] || fail "README.md has no block marked <!-- archive-check: $b -->"
done

archive=$(ls "$DIST"/budgetgate-*.tar.gz 2>/dev/null | head -1)
[ -n "$archive" ] || fail "no archive in $DIST: run scripts/package.sh"
name=$(basename "$archive" .tar.gz)
grep -q "$name" <<<"${blocks[install]}" ||
    fail "README's install commands do not name $name.tar.gz (a new version or target?): update README.md"

work=$(mktemp -d "${TMPDIR:-/tmp}/budgetgate-archive-check.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/user"
cp "$archive" "$archive.sha256" "$work/user/"
[ "$(find "$work/user" -mindepth 1 | wc -l)" = 2 ] || fail "the directory is not empty"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
gw_port=$(free_port)
up_port=$(free_port)
ports() { sed -e "s/127\.0\.0\.1:8080/127.0.0.1:$gw_port/g" -e "s/127\.0\.0\.1:9000/127.0.0.1:$up_port/g"; }
export XDG_STATE_HOME="$work/state"
unset STATE_DIRECTORY BUDGETGATE_CONFIG BUDGETGATE_ADMIN_TOKEN

echo "== install (README, in an empty directory)"
sed 's/^/  $ /' <<<"${blocks[install]}"
# The install block ends in the unpacked directory, where the others run.
dir=$(cd "$work/user" && bash -euo pipefail -c "${blocks[install]}"$'\npwd' | tail -1) ||
    fail "the install commands failed"
[ -x "$dir/bin/budgetgate" ] || fail "no bin/budgetgate in $dir"
ports <"$dir/config/local.toml" >"$work/local.toml" && cp "$work/local.toml" "$dir/config/local.toml"
grep -q "127.0.0.1:$gw_port" "$dir/config/local.toml" || fail "config/local.toml does not listen on 127.0.0.1:8080"

echo "== the simulated upstream and the gateway (README's two terminals)"
(cd "$dir" && exec bash -c "exec $(ports <<<"${blocks[upstream]}")") >"$work/upstream.log" 2>&1 &
pids+=($!)
(cd "$dir" && exec bash -c "$(ports <<<"${blocks[gateway]}" | sed '$ s/^/exec /')") >"$work/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
    grep -q "mock_upstream listening on" "$work/upstream.log" && grep -q "budgetgate listening on" "$work/gateway.log" && break
    sleep 0.1
done
grep -q "budgetgate listening on" "$work/gateway.log" || { tail -20 "$work/gateway.log" >&2; fail "the gateway did not start"; }
grep -q "mock_upstream listening on" "$work/upstream.log" || { tail -20 "$work/upstream.log" >&2; fail "the upstream did not start"; }
echo "  $(grep -m1 "mock_upstream listening on" "$work/upstream.log")"
echo "  $(grep -m1 "budgetgate listening on" "$work/gateway.log")"

echo "== try it (README)"
answer=$(cd "$dir" && bash -euo pipefail -c "$(ports <<<"${blocks[try]}")") || fail "the request failed"
echo "$answer" | head -c 400 && echo
total=$(echo "$answer" | python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["total_tokens"])') ||
    fail "the answer is not a chat completion: $answer"
settled=$(curl -s "http://127.0.0.1:$gw_port/metrics" | awk '/^budgetgate_settled_tokens_total\{.*tenant="demo"/ {print $2}')
[ "${settled%.*}" = "$total" ] || fail "settled tokens of demo: '$settled', the answer's usage: $total"
echo "answered, $total tokens settled on tenant demo"
[ -s "$XDG_STATE_HOME/budgetgate/control.db" ] || fail "no control database under XDG_STATE_HOME"
echo "== passed ($(grep '^profile' "$dir/BUILD-INFO"))"
