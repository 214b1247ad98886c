#!/usr/bin/env bash
# Offline reencryption speed, cryptblk beside cryptsetup, same image, same resilience
# mode, in one run: a LUKS2 image (aes-xts-plain64, 512-bit key, 4096-byte sectors) in
# tmpfs, fully allocated, reencrypted to a new key by `cryptsetup reencrypt
# --force-offline-reencrypt` and by `cryptblk reencrypt`, alternating, ROUNDS times per
# mode; prints each time and the median seconds and ratio per mode. Modes: checksum,
# journal, none (resilience of a key change in place), datashift (a key change moving the
# data 32 MiB up: --reduce-device-size 32M), encrypt-move (a plaintext image encrypted in
# place with the header at its head: --encrypt --reduce-device-size 32M).
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
plain=$DIR/plain.img; rm -f "$plain"; fallocate -l "$SIZE" "$plain"
# What each mode starts from and asks for.
job() {
  case $1 in
    datashift) START=$base; ARGS=(--reduce-device-size 32M) ;;
    encrypt-move) START=$plain; ARGS=(--encrypt --reduce-device-size 32M) ;;
    *) START=$base; ARGS=(--resilience "$1") ;;
  esac
}
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; image $SIZE in $DIR"
out=$(mktemp)
for mode in $MODES; do
  job "$mode"
  for r in $(seq "$ROUNDS"); do
    cp --sparse=never "$START" "$img"
    # (in DIR: a data move makes cryptsetup write a temporary header file in its cwd)
    cs=$(cd "$DIR" && secs cryptsetup reencrypt -q --force-offline-reencrypt "${ARGS[@]}" "${KDF[@]}" --key-file "$DIR/pw" "$img")
    cp --sparse=never "$START" "$img"
    cb=$(secs "$B" reencrypt -q "${ARGS[@]}" "${KDF[@]}" --key-file "$DIR/pw" "$img")
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
print("\n| mode | cryptsetup (median s) | cryptblk (median s) | speed-up |")
print("|---|---|---|---|")
for mode, v in runs.items():
    cs = statistics.median(x for x, _ in v); cb = statistics.median(y for _, y in v)
    print(f"| {mode} | {cs:.2f} | {cb:.2f} | {cs / cb:.2f}x |")
PY
rm -f "$out"
