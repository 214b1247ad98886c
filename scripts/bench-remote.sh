#!/usr/bin/env bash
# The NBD-client backend's speed bar (issue 15): fio over NBD against a remote export used
# directly (qemu-nbd or nbdkit serving the image file) and against cryptblk serving the
# volume whose ciphertext is that same export (cryptblk open nbd+unix:///?socket=REMOTE),
# the peer benchmark's five workloads, alternating, ROUNDS times; medians and ratios.
# The direct runs serve raw.img (fio writes over it), the cryptblk runs luks1.img.
# With cores to spare, REMOTE_CPUS (the remote server, direct or under cryptblk), SERVER_CPUS
# (cryptblk) and CLIENT_CPUS (fio), taskset lists, put each on CPUs of its own, as on two hosts.
# CRYPTBLK_BIN picks another cryptblk build, NBDKIT_FILE_PLUGIN nbdkit's file plugin by path.
# usage: [ROUNDS=3] scripts/bench-remote.sh [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-5}; ROUNDS=${ROUNDS:-3}
B=${CRYPTBLK_BIN:-$PWD/target/release/cryptblk}; export CRYPTBLK_BIN=$B
[ -x "$B" ] || cargo build --release -p cryptblk >/dev/null
P=${PEER_DIR:-/dev/shm/cryptblk-peer}; export PEER_DIR=$P
mkdir -p "$P"
R=$P/remote.sock
OUT=$(mktemp); trap 'rm -f "$OUT"' EXIT
PIN_REMOTE=${REMOTE_CPUS:+taskset -c $REMOTE_CPUS}
QEMU="qemu-nbd -f raw -t --shared=8 --cache=none --aio=threads"
KIT="nbdkit -f ${NBDKIT_FILE_PLUGIN:-file}"
for r in $(seq "$ROUNDS"); do
  echo "== round $r of $ROUNDS (${RT}s per figure, MB/s)"
  NO_BUILTIN_PEERS=1 bash scripts/peer-bench.sh "$RT" \
    "qemu-nbd-direct=$PIN_REMOTE $QEMU -k $P/nbd.sock raw.img" \
    "cryptblk-over-qemu-nbd=bash $PWD/scripts/serve-over-remote.sh $R $QEMU -k $R luks1.img" \
    "nbdkit-direct=$PIN_REMOTE $KIT -U $P/nbd.sock raw.img" \
    "cryptblk-over-nbdkit=bash $PWD/scripts/serve-over-remote.sh $R $KIT -U $R luks1.img" \
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
wl = ["4k-rw-qd1", "4k-randread-qd16", "4k-randwrite-qd16", "128k-read-qd8", "128k-write-qd8"]
print("\n| server (median MB/s) | " + " | ".join(wl) + " |")
print("|---" * (len(wl) + 1) + "|")
for k, v in rows.items():
    print(f"| {k} | " + " | ".join(f"{x:.0f}" for x in v) + " |")
print("\n| remote | " + " | ".join(wl) + " |  (cryptblk over the export ÷ the export directly, bar ≥ 0.9)")
print("|---" * (len(wl) + 1) + "|")
for remote in ("qemu-nbd", "nbdkit"):
    a, b = rows.get(f"cryptblk-over-{remote}"), rows.get(f"{remote}-direct")
    if a and b:
        print(f"| {remote} | " + " | ".join(f"{x / y:.2f}" if y else "-" for x, y in zip(a, b)) + " |")
PY
