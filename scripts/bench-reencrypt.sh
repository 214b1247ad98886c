#!/usr/bin/env bash
# Offline reencryption speed, cryptblk beside cryptsetup, same image, same resilience
# mode, in one run: a LUKS2 image (aes-xts-plain64, 512-bit key, 4096-byte sectors) in
# tmpfs, fully allocated, reencrypted to a new key by `cryptsetup reencrypt
# --force-offline-reencrypt` and by `cryptblk reencrypt`, alternating, ROUNDS times per
# mode; prints each time and the median seconds and ratio per mode.
# usage: [ROUNDS=3] [SIZE=4G] [DIR=private dir in /dev/shm] scripts/bench-reencrypt.sh [modes...]
set -euo pipefail
cd "$(dirname "$0")/.."
# A fresh private (0700) directory unless DIR names one: no path another user could plant.
ROUNDS=${ROUNDS:-3}; SIZE=${SIZE:-4G}; DIR=${DIR:-$(mktemp -d /dev/shm/cryptblk-reenc.XXXXXX)}
MODES=${*:-checksum journal none}
B=$PWD/target/release/cryptblk
[ -x "$B" ] || cargo build --release -p cryptblk >/dev/null
mkdir -p -m 0700 "$DIR"; trap 'rm -rf "$DIR"' EXIT
(umask 077; printf 'reencrypt me' > "$DIR/pw")
KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
base=$DIR/base.img; img=$DIR/img
rm -f "$base"; fallocate -l "$SIZE" "$base"
cryptsetup luksFormat -q --type luks2 --sector-size 4096 "${KDF[@]}" --key-file "$DIR/pw" "$base"
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; image $SIZE in $DIR"
out=$(mktemp)
for mode in $MODES; do
  for r in $(seq "$ROUNDS"); do
    cp --sparse=never "$base" "$img"
    cs=$(secs cryptsetup reencrypt -q --force-offline-reencrypt --resilience "$mode" "${KDF[@]}" --key-file "$DIR/pw" "$img")
    cp --sparse=never "$base" "$img"
    cb=$(secs "$B" reencrypt -q --resilience "$mode" "${KDF[@]}" --key-file "$DIR/pw" "$img")
    echo "$mode round $r: cryptsetup ${cs}s cryptblk ${cb}s" | tee -a "$out"
  done
done
rm -f "$img"
python3 - "$out" <<'PY'
import sys, statistics, re
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) round \d+: cryptsetup ([\d.]+)s cryptblk ([\d.]+)s", line)
    if m:
        runs.setdefault(m[1], []).append((float(m[2]), float(m[3])))
print("\n| resilience | cryptsetup (median s) | cryptblk (median s) | speed-up |")
print("|---|---|---|---|")
for mode, v in runs.items():
    cs = statistics.median(x for x, _ in v); cb = statistics.median(y for _, y in v)
    print(f"| {mode} | {cs:.2f} | {cb:.2f} | {cs / cb:.2f}x |")
PY
rm -f "$out"
