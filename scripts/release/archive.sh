#!/usr/bin/env bash
# The release archive and its SHA-256: a release build of the gateway and
# the simulated upstream, packed by scripts/package.sh into
# target/dist/budgetgate-<version>-<target>.tar.gz(.sha256), then the
# checksum verified and the archive checked as a user meets it
# (scripts/archive-check.sh).
#
#   scripts/release/archive.sh                 # release build (what a release ships)
#   PROFILE=debug scripts/release/archive.sh   # the test build's binaries (the dry run in CI)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
release_check_tag
PROFILE=${PROFILE:-release}
if [ "$PROFILE" = release ]; then
    cargo build --release --locked --bins --examples
fi
PROFILE=$PROFILE scripts/package.sh
(cd "$DIST" && sha256sum -c --quiet budgetgate-"$VERSION"-*.tar.gz.sha256) || release_fail "checksum"
PROFILE=$PROFILE scripts/archive-check.sh
