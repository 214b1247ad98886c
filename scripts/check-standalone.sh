#!/usr/bin/env bash
# Fails if anything that builds, tests or benchmarks the project reaches outside the
# repository (a fresh clone has nothing beside it): no sibling "shared" folder, no absolute paths into
# a developer's checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
hits=$(git ls-files -- scripts tests .ci crates fuzz Makefile Cargo.toml |
  grep -v '^scripts/check-standalone.sh$' |
  xargs grep -nE '\.\./shared|/work/(main|shared)' 2> /dev/null || true)
if [ -n "$hits" ]; then
  echo "check-standalone: these lines reach outside the repository:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "check-standalone: nothing outside the repository is referenced"
