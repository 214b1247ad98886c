#!/usr/bin/env bash
# Sets up and runs every test: format and lint checks, the workspace tests (unit,
# known-answer, property and interop tests with the real cryptsetup/openssl/qemu/nbd
# tools, damaged-header and crash-point suites), the crypto tests again on software AES,
# every fuzz target for FUZZ_SECONDS (default 20) seconds, and the kernel tests (dm-crypt
# interop, the NBD, FUSE and ublk frontends) in a throwaway VM (tests/vm/vm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CARGO_TERM_COLOR=never
# Each stage's wall time, printed as it ends, so a slow CI run says where the time went.
stage_start=$SECONDS; stage_name=setup
stage() {
  echo "== ($stage_name took $((SECONDS - stage_start)) s; $SECONDS s in all)"
  stage_start=$SECONDS; stage_name=$1; echo "== $1"
}
stage "nothing outside the repository"
bash scripts/check-standalone.sh
stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
stage "cargo test (workspace)"
# The `ci` profile (Cargo.toml): release code, no LTO, no debug info; into target/ci/.
cargo build --profile ci --workspace --bins --examples
# The test binaries two at a time (TEST_JOBS, default the CPU count), longest first: most
# tests wait on other processes as much as they compute (scripts/run-tests.py).
python3 scripts/run-tests.py --profile ci --workspace
stage "cryptsetup's own test scripts, cryptblk beside cryptsetup (tests/cryptsetup-suite)"
python3 tests/cryptsetup-suite/run.py
stage "crypto tests on the portable constant-time AES (aes_backend=soft)"
RUSTFLAGS='--cfg aes_backend="soft"' cargo test --profile ci -p cryptblk-crypto --target-dir target/soft-aes
stage "fuzz targets, ${FUZZ_SECONDS:-20}s each (nightly + cargo-fuzz)"
FUZZ_SECONDS=${FUZZ_SECONDS:-20} bash scripts/fuzz.sh
stage "kernel tests in a VM (tests/vm/vm.sh)"
CRYPTBLK_BIN="$PWD/target/ci/cryptblk" bash tests/vm/run.sh
stage done
