#!/usr/bin/env bash
# Runs every test of budgetgate. Installs what the tests need when missing:
# redis-server, chromium + chromedriver, promtool, PostgreSQL, podman and
# debootstrap (Debian packages), a Python virtualenv with the pinned openai
# and anthropic SDKs (and podman-compose, scripts/compose.sh), the pinned
# coding-agent CLIs (Codex CLI, Claude Code, OpenCode) under tests/agents/ (npm install from the lockfile).
# Then the distribution checks: the Kubernetes manifests (offline, and the
# fleet as pods with podman kube play), the container image, the compose
# fleet, the release pipeline's dry run (archive, SBOM, image); and the
# enforcement-accuracy benchmark's quick run.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server, Debian's chromium and chromedriver (the budget page test),
# promtool (the deploy/ kit test): apt-get, each only when missing.
scripts/install-test-deps.sh

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import openai, anthropic" >/dev/null 2>&1 \
   || ! cmp -s tests/python/requirements.txt .venv/.requirements 2>/dev/null; then
    echo "creating .venv with the pinned openai and anthropic SDKs..."
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r tests/python/requirements.txt
    cp tests/python/requirements.txt .venv/.requirements
fi
export BUDGETGATE_PYTHON="$PWD/.venv/bin/python"

# The coding agents the real-CLI tests drive (tests/it/agents_cli.rs), pinned
# with integrity hashes in tests/agents/package-lock.json. Their native
# binaries are optional dependencies: --include=optional. Reinstalled when
# the lockfile changed.
if ! cmp -s tests/agents/package-lock.json tests/agents/node_modules/.package-lock.json.installed 2>/dev/null \
   || [ ! -x tests/agents/node_modules/.bin/codex ] || [ ! -x tests/agents/node_modules/.bin/claude ] \
   || [ ! -x tests/agents/node_modules/.bin/opencode ]; then
    echo "installing the pinned coding-agent CLIs (npm install from the lockfile)..."
    # Not `npm ci`: it refuses opencode-ai's lockfile, which npm writes
    # without the other platforms' optional binaries and then asks for
    # them. `npm install` installs the lockfile's versions and integrity
    # hashes all the same (and leaves the lockfile as it is).
    (cd tests/agents && npm install --include=optional --no-audit --no-fund)
    cp tests/agents/package-lock.json tests/agents/node_modules/.package-lock.json.installed
fi
tests/agents/node_modules/.bin/codex --version
HOME="$(mktemp -d)" tests/agents/node_modules/.bin/claude --version
HOME="$(mktemp -d)" tests/agents/node_modules/.bin/opencode --version

# --no-fail-fast: one failing test file must not hide the results of the others.
# No feature flags: every suite is compiled into a plain `cargo test`.
# Its output is kept too: the failed tests are named again at the very end.
status=0
cargo_log=$(mktemp -t budgetgate-test.XXXXXX)
cargo test --all-targets --no-fail-fast "$@" 2>&1 | tee "$cargo_log" || status=$?

# The distribution checks: the container image, the compose
# fleet, the release archive. They run on a full run (no arguments; DIST=0
# skips them, DIST=1 forces them) and on the test build's binaries: what
# they check — the Containerfile, the image's user, volume, health check and
# signals, the compose wiring, the archive's layout and the README's commands
# — does not depend on the optimisation level, and a release build would add
# ~10 minutes of both cores (docs/PERFORMANCE.md, "CI time").
# DIST_PROFILE=release checks release binaries instead (build them first).
DIST=${DIST:-$([ $# -eq 0 ] && echo 1 || echo 0)}
if [ "$DIST" = 1 ]; then
    DIST_PROFILE=${DIST_PROFILE:-debug}
    if [ "$DIST_PROFILE" = debug ]; then
        # With the examples in the build, the features are those of the tests
        # above: this links, it compiles nothing again.
        cargo build --bins --examples
    fi
    summary=()
    # kubernetes-check.sh: the manifests of deploy/kubernetes/, rendered and
    # validated offline; kube-play.sh: the fleet run as pods by `podman kube
    # play` and checked. release-dry-run.sh: the release workflow's steps
    # without publishing (actionlint; the archive, its checksum and
    # scripts/archive-check.sh; the SBOM; the image from the archive's
    # binary, IMAGE_TARGET=prebuilt: no toolchain image is reachable).
    for check in kubernetes-check.sh image.sh compose.sh kube-play.sh release-dry-run.sh; do
        t0=$SECONDS
        echo "=== scripts/$check (PROFILE=$DIST_PROFILE)"
        if PROFILE=$DIST_PROFILE IMAGE_TARGET=prebuilt "scripts/$check"; then
            summary+=("$check ok ($((SECONDS - t0)) s)")
        else
            summary+=("$check FAILED ($((SECONDS - t0)) s)")
            status=1
        fi
    done
    # The enforcement-accuracy benchmark, one variant of each scenario
    # (docs/ACCURACY.md), on the same binaries: it prints its
    # table and fails only when a scenario is invalid or a bound is broken.
    t0=$SECONDS
    echo "=== QUICK=1 scripts/accuracy.sh (PROFILE=$DIST_PROFILE)"
    if QUICK=1 BUILD=0 PROFILE=$DIST_PROFILE scripts/accuracy.sh; then
        summary+=("accuracy.sh ok ($((SECONDS - t0)) s)")
    else
        summary+=("accuracy.sh FAILED ($((SECONDS - t0)) s)")
        status=1
    fi
    echo "distribution checks: ${summary[*]}"
fi
# Last, so that a long run's failures are not lost above the distribution
# checks: every test that failed (from cargo's `test … FAILED` lines), the
# suites that failed (`error: test failed, to rerun pass …`) and anything
# that did not compile.
failed_tests=$(grep -E '^test .+ \.\.\. FAILED$' "$cargo_log" | sed -E 's/^test (.+) \.\.\. FAILED$/  \1/' | sort -u || true)
failed_suites=$(grep -E '^error: (test failed|could not compile)' "$cargo_log" | sort -u || true)
if [ -n "$failed_tests" ] || [ -n "$failed_suites" ]; then
    status=1
    echo "=== cargo test: failures (whole output: $cargo_log)"
    [ -n "$failed_suites" ] && echo "$failed_suites"
    if [ -n "$failed_tests" ]; then
        echo "failed tests ($(echo "$failed_tests" | wc -l)):"
        echo "$failed_tests"
    fi
else
    echo "=== cargo test: every test passed"
    rm -f "$cargo_log"
fi
exit "$status"
