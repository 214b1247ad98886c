#!/usr/bin/env bash
# The cipher speed bar of the core issue: cryptblk's engine against the system OpenSSL,
# aes-xts-plain64 512-bit key, one core, in the same run. Prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/cryptblk ] || cargo build --release -p cryptblk >/dev/null
SECS=${SECS:-1}
ossl() { # bytes [-decrypt] → MB/s (openssl prints kB/s with k = 1000 bytes)
  openssl speed -seconds "$SECS" ${2:-} -evp aes-256-xts -bytes "$1" 2>/dev/null | awk '/^AES-256-XTS/ {sub("k","",$2); printf "%.0f", $2/1000}'
}
cb() { # sector request → "enc dec"
  taskset -c 0 target/release/cryptblk benchmark --json --cipher aes-xts-plain64 --key-size 512 \
    --sector-size "$1" --request-size "$2" --seconds "$SECS" |
    python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print("%.0f %.0f"%(r["encrypt_mb_s"],r["decrypt_mb_s"]))'
}
o512=$(taskset -c 0 bash -c "$(declare -f ossl); SECS=$SECS ossl 512")
o4096=$(taskset -c 0 bash -c "$(declare -f ossl); SECS=$SECS ossl 4096")
od512=$(taskset -c 0 bash -c "$(declare -f ossl); SECS=$SECS ossl 512 -decrypt")
od4096=$(taskset -c 0 bash -c "$(declare -f ossl); SECS=$SECS ossl 4096 -decrypt")
read e512 d512 < <(cb 512 4096)
read e4k d4k < <(cb 4096 4096)
read e512s d512s < <(cb 512 512)
echo "| figure | MB/s encrypt | MB/s decrypt | vs OpenSSL (enc / dec) | bar |"
echo "|---|---|---|---|---|"
echo "| openssl speed [-decrypt] -evp aes-256-xts -bytes 512 | $o512 | $od512 | | |"
echo "| openssl speed [-decrypt] -evp aes-256-xts -bytes 4096 | $o4096 | $od4096 | | |"
r() { python3 -c "print('%.2f×' % ($1/$2))"; }
echo "| cryptblk, 4096-byte sectors, 4 KiB requests | $e4k | $d4k | $(r $e4k $o4096) / $(r $d4k $od4096) | ≥ 1.70× |"
echo "| cryptblk, 512-byte sectors, 4 KiB requests | $e512 | $d512 | $(r $e512 $o512) / $(r $d512 $od512) | ≥ 1.50× |"
echo "| cryptblk, 512-byte sectors, one sector per call | $e512s | $d512s | $(r $e512s $o512) / $(r $d512s $od512) | (info) |"
