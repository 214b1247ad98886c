#!/usr/bin/env bash
# Runs every cargo-fuzz target for FUZZ_SECONDS seconds each (default 60), on seed corpora
# made by the real cryptsetup (fuzz/seed.sh) plus whatever fuzz/corpus/ already holds.
# Needs a nightly toolchain (libFuzzer instrumentation); installs cargo-fuzz if missing.
# Fails on the first crash, leak, timeout or out-of-memory; the reproducer lands in
# fuzz/artifacts/<target>/ (rerun with: cargo +nightly fuzz run <target> <file>).
# Executions per target are printed at the end and written to fuzz/stats.txt.
# Targets run FUZZ_JOBS at a time (default: the CPU count), each on one CPU.
# Usage: scripts/fuzz.sh [TARGET...]   (env: FUZZ_SECONDS, FUZZ_JOBS, FUZZ_TOOLCHAIN=nightly)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
toolchain=${FUZZ_TOOLCHAIN:-nightly}

if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: ERROR: the '$toolchain' Rust toolchain is not installed; cargo-fuzz needs" >&2
    echo "fuzz.sh: nightly for libFuzzer instrumentation. Install it with:" >&2
    echo "fuzz.sh:     rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo "+$toolchain" fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

bash fuzz/seed.sh fuzz/seeds

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cd fuzz && cargo "+$toolchain" fuzz list)
fi
echo "fuzz.sh: building ${#targets[@]} targets"
(cd fuzz && cargo "+$toolchain" fuzz build -O -a)

stats=fuzz/stats.txt
: > "$stats"
mkdir -p fuzz/logs fuzz/logs/status
rm -f fuzz/logs/status/*
# One target per CPU at a time (libFuzzer runs each on one thread): FUZZ_JOBS at once.
jobs_max=${FUZZ_JOBS:-$(nproc)}
fuzz_one() {
    local t=$1
    mkdir -p "fuzz/corpus/$t"
    local log="fuzz/logs/$t.log"
    local extra=()
    local asan=${ASAN_OPTIONS:-}
    if [ "$t" = nbd_session ]; then
        # Each input runs a connection on threads; LeakSanitizer then reports glibc's
        # per-thread destructor list (__cxa_thread_atexit_impl), or std's handle of a
        # scoped thread, of a thread that is joined but not yet torn down: a false
        # positive. Off per input (libFuzzer) and at exit (the sanitizer's own check).
        extra=(-detect_leaks=0)
        asan="${asan:+$asan:}detect_leaks=0"
    fi
    echo "== fuzz $t for ${seconds}s"
    # -O -a: optimized, with debug assertions and overflow checks.
    if (cd fuzz && ASAN_OPTIONS="$asan" cargo "+$toolchain" fuzz run -O -a "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
        "${extra[@]}" >"logs/$t.log" 2>&1); then
        echo 0 > "fuzz/logs/status/$t"
    else
        echo 1 > "fuzz/logs/status/$t"
    fi
}
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
    fuzz_one "$t" &
done
wait
failed=0
for t in "${targets[@]}"; do
    log="fuzz/logs/$t.log"
    if [ "$(cat "fuzz/logs/status/$t" 2>/dev/null)" != 0 ]; then
        tail -n 60 "$log" >&2
        echo "fuzz.sh: FAILED: target $t found a problem; see $log and fuzz/artifacts/$t/" >&2
        failed=1
        continue
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    corpus=$(ls "fuzz/corpus/$t" | wc -l)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1 | cut -d' ' -f2)
    printf '%-14s %10s execs in %ss, coverage %s, corpus %s\n' \
        "$t" "${execs:-?}" "$seconds" "${cov:-?}" "$corpus" | tee -a "$stats"
done
[ "$failed" = 0 ] || exit 1
echo "fuzz.sh: all targets ran ${seconds}s without findings"
cat "$stats"
