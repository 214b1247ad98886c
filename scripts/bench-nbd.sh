#!/usr/bin/env bash
# The data-path speed bars: scripts/peer-bench.sh (fio over NBD on a unix socket, one
# LUKS1 image in tmpfs) with cryptblk (aes-xts-plain64) and cryptblk with cipher_null on the
# same image's data area (both with the default I/O engine: mmap, the image being on tmpfs),
# and cryptblk forced to pread/pwrite (--io-engine psync), beside nbdkit (file plugin, luks filter) and qemu-nbd (raw, LUKS),
# all in one run, repeated ROUNDS times (machines are noisy: single runs of these short
# workloads vary by ±25 %). Prints every round, then the median of each cell and the ratios
# the issue asks for, computed on the medians.
# ONLY="NAME..." runs only those servers (ratios of the others print as nan);
# SERVER_CPUS/CLIENT_CPUS pin the servers and fio apart (scripts/peer-bench.sh).
# usage: [ROUNDS=3] scripts/bench-nbd.sh [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-5}; ROUNDS=${ROUNDS:-3}
B=$PWD/target/release/cryptblk
[ -x "$B" ] || cargo build --release -p cryptblk >/dev/null
P=${PEER_DIR:-/dev/shm/cryptblk-peer}; export PEER_DIR=$P
mkdir -p $P; head -c 32 /dev/urandom > $P/null.key
OUT=$(mktemp); trap 'rm -f "$OUT"' EXIT
S="--nbd unix:$P/nbd.sock --run-dir $P/run"
for r in $(seq "$ROUNDS"); do
  echo "== round $r of $ROUNDS (${RT}s per figure, MB/s)"
  bash scripts/peer-bench.sh "$RT" \
    "cryptblk=$B open luks1.img pb $S --key-file pw" \
    "cryptblk-psync=$B open luks1.img pb $S --key-file pw --io-engine psync" \
    "cryptblk-null=$B open luks1.img pb $S --key-file null.key --type plain --cipher cipher_null-ecb --key-size 256 --offset 4096" \
    | tee -a "$OUT"
done
python3 - "$OUT" <<'PY'
import sys, statistics
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 6 and f[0] != "server":
        runs.setdefault(f[0], []).append([float(x) if x != "ERR" else 0.0 for x in f[1:]])
rows = {k: [statistics.median(c) for c in zip(*v)] for k, v in runs.items()}
print("\n| server (median MB/s) | 4k rw QD1 | 4k randread QD16 | 4k randwrite QD16 | 128k read QD8 | 128k write QD8 |")
print("|---|---|---|---|---|---|")
for k, v in rows.items():
    print(f"| {k} | " + " | ".join(f"{x:.0f}" for x in v) + " |")
wl = ["4k-rw-qd1", "4k-randread-qd16", "4k-randwrite-qd16", "128k-read-qd8", "128k-write-qd8"]
def ratio(a, b, i):
    return rows[a][i] / rows[b][i] if rows.get(a) and rows.get(b) and rows[b][i] else float("nan")
print("\n| workload | ÷ nbdkit luks (≥1.5) | ÷ qemu-nbd LUKS (≥2) | aes ÷ cipher_null (≥0.9) | cipher_null ÷ nbdkit file (≥0.9) | aes ÷ nbdkit file, unencrypted (≥1.0) |")
print("|---|---|---|---|---|---|")
for i, w in enumerate(wl):
    print(f"| {w} | {ratio('cryptblk','nbdkit-luks',i):.2f}× | {ratio('cryptblk','qemu-nbd-luks',i):.2f}× "
          f"| {ratio('cryptblk','cryptblk-null',i):.2f} | {ratio('cryptblk-null','nbdkit-raw',i):.2f} "
          f"| {ratio('cryptblk','nbdkit-raw',i):.2f} |")
PY
