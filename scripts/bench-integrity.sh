#!/usr/bin/env bash
# LUKS2 with integrity over NBD (issue 38's speed bars): fio's nbd engine (the five
# workloads of scripts/peer-bench.sh) against cryptblk serving, from tmpfs, the LUKS1
# aes-xts-plain64 image of the NBD benchmark and two LUKS2 images of the same size with
# integrity, 4096-byte sectors, formatted and wiped by cryptblk: aes-gcm-random + aead and
# aes-xts-plain64 + hmac-sha256. Same run, ROUNDS rounds; prints the medians and the ratios
# to plain XTS the issue asks for (writes >= 0.5x in journal mode, 0.8x without the
# journal (`gcm-no-journal`: --integrity-no-journal, the kernel's mode D) and in bitmap
# mode (`crc32c-bitmap`: a standalone integritysetup volume, crc32c, 4096-byte blocks,
# --integrity-bitmap-mode); reads >= 0.8x).
# usage: [ROUNDS=3] scripts/bench-integrity.sh [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-3}; ROUNDS=${ROUNDS:-3}
B=$PWD/target/release/cryptblk
[ -x "$B" ] || cargo build --release -p cryptblk > /dev/null
P=${PEER_DIR:-/dev/shm/cryptblk-peer}; export PEER_DIR=$P
ONLY=none bash scripts/peer-bench.sh 1 > /dev/null
for m in "gcm aes-gcm-random aead" "hmac aes-xts-plain64 hmac-sha256"; do
  set -- $m
  if [ ! -f "$P/int-$1.img" ]; then
    truncate -s 1100M "$P/int-$1.img"
    "$B" format -q --type luks2 --cipher "$2" --integrity "$3" --sector-size 4096 \
      --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$P/pw" "$P/int-$1.img"
  fi
done
if [ ! -f "$P/int-crc32c.img" ]; then
  truncate -s 1100M "$P/int-crc32c.img"
  "$B" format -q --type integrity --sector-size 4096 "$P/int-crc32c.img"
fi
OUT=$(mktemp); trap 'rm -f "$OUT"' EXIT
for r in $(seq "$ROUNDS"); do
  echo "== round $r of $ROUNDS (${RT}s per figure)"
  NO_BUILTIN_PEERS=1 bash scripts/peer-bench.sh "$RT" \
    "xts=$B open luks1.img pb --nbd unix:$P/nbd.sock --run-dir $P/run --key-file pw" \
    "gcm-integrity=$B open int-gcm.img pb --nbd unix:$P/nbd.sock --run-dir $P/run --key-file pw" \
    "hmac-integrity=$B open int-hmac.img pb --nbd unix:$P/nbd.sock --run-dir $P/run --key-file pw" \
    "gcm-no-journal=$B open int-gcm.img pb --nbd unix:$P/nbd.sock --run-dir $P/run --key-file pw --integrity-no-journal" \
    "crc32c-bitmap=$B open int-crc32c.img pb --nbd unix:$P/nbd.sock --run-dir $P/run --type integrity -B" |
    grep -v '^server' | tee -a "$OUT"
done
python3 - "$OUT" << 'PY'
import sys
sys.path.insert(0, "scripts")
from peer_medians import WORKLOADS, medians, ratios, table
rows = medians(sys.argv[1])
table(rows)
print("\n| ÷ plain XTS | " + " | ".join(WORKLOADS) + " |")
print("|---" * (len(WORKLOADS) + 1) + "|")
for k in rows:
    if k != "xts":
        print(f"| {k} | " + " | ".join(f"{r:.2f}" for r in ratios(rows, k, "xts")) + " |")
PY
