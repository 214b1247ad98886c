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
import sys
sys.path.insert(0, "scripts")
from peer_medians import WORKLOADS, medians, ratios, table
rows = medians(sys.argv[1])
table(rows)
print("\n| remote | " + " | ".join(WORKLOADS) + " |  (cryptblk over the export ÷ the export directly, bar ≥ 0.9)")
print("|---" * (len(WORKLOADS) + 1) + "|")
for remote in ("qemu-nbd", "nbdkit"):
    if rows.get(f"cryptblk-over-{remote}") and rows.get(f"{remote}-direct"):
        r = ratios(rows, f"cryptblk-over-{remote}", f"{remote}-direct")
        print(f"| {remote} | " + " | ".join(f"{x:.2f}" for x in r) + " |")
PY
