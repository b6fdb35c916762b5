#!/usr/bin/env bash
# Attaches the release's files (target/dist: the archive, its .sha256, the
# SBOM) to the GitHub release of RELEASE_TAG, creating the release when
# missing. Needs the gh CLI and GH_TOKEN (GitHub Actions has both). The dry
# run never calls it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO"
: "${RELEASE_TAG:?set RELEASE_TAG (the tag, v$VERSION)}"
release_check_tag
files=("$DIST"/budgetgate-"$VERSION"-*.tar.gz "$DIST"/budgetgate-"$VERSION"-*.tar.gz.sha256 "$DIST/budgetgate-$VERSION.cdx.json")
for f in "${files[@]}"; do [ -f "$f" ] || release_fail "$f is missing"; done
image=$(echo "${IMAGE:-}" | tr '[:upper:]' '[:lower:]')
notes="budgetgate $VERSION: the release archive (Linux x86_64, glibc), its SHA-256 and the SBOM (CycloneDX JSON).${image:+ Image: $image:$VERSION (and :latest).}"
if gh release view "$RELEASE_TAG" >/dev/null 2>&1; then
    gh release upload "$RELEASE_TAG" "${files[@]}" --clobber
else
    gh release create "$RELEASE_TAG" "${files[@]}" --title "budgetgate $VERSION" --notes "$notes" --verify-tag
fi
