#!/usr/bin/env bash
# The vhost-user-blk speed bars (issue 37), without a VM: the crate's client
# (crates/vhost-user-blk/examples/vhost-bench.rs) plays the VM, one queue, against cryptblk
# (LUKS1 aes-xts-plain64, and cipher_null on the same data area) and qemu-storage-daemon
# (--export type=vhost-user-blk in an iothread, its polling on, over its LUKS driver and over
# the raw image), all on the
# images of scripts/peer-bench.sh in tmpfs; and cryptblk's own NBD figures for the same
# workloads and image (fio's nbd engine, scripts/peer-bench.sh), in the same run. Repeated
# ROUNDS times; prints every round, then medians and the ratios the issue asks for.
# QUEUES=N (default 1) gives every server N virtqueues (cryptblk --queues N, qemu-storage-
# daemon num-queues=N) and spreads the client's depth over them (as a guest with N vCPUs
# has N queues; the client still drives them from one thread).
# usage: [ROUNDS=3] [QUEUES=1] scripts/bench-vhost-user-blk.sh [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-3}; ROUNDS=${ROUNDS:-3}; Q=${QUEUES:-1}
B=$PWD/target/release/cryptblk
[ -x "$B" ] || cargo build --release -p cryptblk > /dev/null
cargo build --release -q -p cryptblk-vhost-user-blk --example vhost-bench
VB=$PWD/target/release/examples/vhost-bench
QSD=$(command -v qemu-storage-daemon) || { echo "bench-vhost-user-blk: qemu-storage-daemon is not installed (apt-get install qemu-system-common)" >&2; exit 1; }
P=${PEER_DIR:-/dev/shm/cryptblk-peer}; export PEER_DIR=$P
# peer-bench.sh makes the images (LUKS1 with passphrase "pass" in $P/pw, raw) on first use.
ONLY=none bash scripts/peer-bench.sh 1 > /dev/null
head -c 32 /dev/urandom > "$P/null.key"
SOCK=$P/vub.sock
servers=(
  "cryptblk=$B open $P/luks1.img vb --vhost-user-blk $SOCK --queues $Q --run-dir $P/run --key-file $P/pw"
  "cryptblk-null=$B open $P/luks1.img vb --vhost-user-blk $SOCK --queues $Q --run-dir $P/run --key-file $P/null.key --type plain --cipher cipher_null-ecb --key-size 256 --offset 4096"
  "qsd-luks=$QSD --object iothread,id=io0 --object secret,id=s0,data=pass --blockdev driver=file,node-name=f0,filename=$P/luks1.img --blockdev driver=luks,node-name=l0,file=f0,key-secret=s0 --export type=vhost-user-blk,id=e0,node-name=l0,addr.type=unix,addr.path=$SOCK,writable=on,iothread=io0,num-queues=$Q"
  "qsd-raw=$QSD --object iothread,id=io0 --blockdev driver=file,node-name=f0,filename=$P/raw.img --export type=vhost-user-blk,id=e0,node-name=f0,addr.type=unix,addr.path=$SOCK,writable=on,iothread=io0,num-queues=$Q"
)
OUT=$(mktemp); trap 'rm -f "$OUT"' EXIT
for r in $(seq "$ROUNDS"); do
  echo "== round $r of $ROUNDS (${RT}s per figure, $Q queue(s), MiB/s)"
  for entry in "${servers[@]}"; do
    name=${entry%%=*}
    rm -f "$SOCK"
    ${entry#*=} > /dev/null 2> "$P/$name.err" &
    server=$!
    for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
    printf '%-16s' "$name"
    "$VB" "$SOCK" "$RT" "$Q" | awk '{printf "%20s", int($3)}'
    echo
    kill "$server" 2> /dev/null; wait "$server" 2> /dev/null || true
  done | tee -a "$OUT"
  NO_BUILTIN_PEERS=1 bash scripts/peer-bench.sh "$RT" \
    "cryptblk-nbd=$B open luks1.img pb --nbd unix:$P/nbd.sock --run-dir $P/run --key-file pw" |
    grep -v '^server' | tee -a "$OUT"
done
python3 - "$OUT" << 'PY'
import sys
sys.path.insert(0, "scripts")
from peer_medians import WORKLOADS, medians, ratios, table
rows = medians(sys.argv[1])
table(rows, "MiB/s")
cols = [ratios(rows, "cryptblk", "qsd-luks"), ratios(rows, "cryptblk", "qsd-raw"),
        ratios(rows, "cryptblk", "cryptblk-nbd"), ratios(rows, "cryptblk-null", "qsd-raw")]
print("\n| workload | cryptblk ÷ qsd LUKS (≥2) | cryptblk ÷ qsd raw (≥1.0) | cryptblk ÷ its NBD (>1) | cipher_null ÷ qsd raw |")
print("|---|---|---|---|---|")
for i, w in enumerate(WORKLOADS):
    print(f"| {w} | {cols[0][i]:.2f}× | {cols[1][i]:.2f} | {cols[2][i]:.2f} | {cols[3][i]:.2f} |")
PY
