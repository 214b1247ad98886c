#!/usr/bin/env bash
# The cipher speed bars: cryptblk's engine (every backend this CPU runs) against the system
# OpenSSL and, when KERNEL_XTS_BENCH names a command printing the kernel's own XTS figures
# (lines "driver sector enc|dec MB/s ns/sector", e.g. the xts-bench tool that assembles the
# kernel's arch/x86/crypto code in userspace; it takes the seconds per figure as its last
# argument), the kernel's drivers. aes-xts-plain64, one core (taskset -c 0), all measured in
# the same rounds, alternating, ROUNDS times (shared machines are noisy: one figure varies by
# ±20 % from run to run); the table shows the median of each figure and ratios of medians.
# usage: [ROUNDS=5] [SECS=0.5] [KERNEL_XTS_BENCH='path/to/run.sh'] scripts/bench-cipher.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/cryptblk ] || cargo build --release -p cryptblk >/dev/null
ROUNDS=${ROUNDS:-5}; SECS=${SECS:-0.5}
OSECS=$(python3 -c "import math; print(max(1, math.ceil($SECS)))") # openssl takes whole seconds
CB=target/release/cryptblk
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); $(openssl version | cut -d' ' -f1-2); $ROUNDS rounds of ${SECS}s per figure"
BACKENDS=$(for b in vaes512 vaes256 aesni generic; do
  $CB benchmark --backend "$b" --cipher aes-xts-plain64 --no-kdf --seconds 0.01 > /dev/null 2>&1 && echo "$b"; done)
CHOSEN=$($CB benchmark --cipher aes-xts-plain64 --no-kdf --seconds 0.01 | sed -n 's/.*backend \([a-z0-9]*\).*/\1/p')
D=$(mktemp); trap 'rm -f "$D"' EXIT
for r in $(seq "$ROUNDS"); do
  echo "round $r of $ROUNDS" >&2
  for n in 512 4096; do
    for dir in "" -decrypt; do
      # openssl prints kB/s with k = 1000 bytes
      v=$(taskset -c 0 openssl speed -seconds "$OSECS" $dir -evp aes-256-xts -bytes $n 2>/dev/null |
        awk '/^AES-256-XTS/ {sub("k","",$2); printf "%.0f", $2/1000}')
      echo "openssl $n $([ -n "$dir" ] && echo dec || echo enc) $v" >> "$D"
    done
  done
  if [ -n "${KERNEL_XTS_BENCH:-}" ]; then
    taskset -c 0 bash -c "$KERNEL_XTS_BENCH $SECS" |
      awk 'NF == 5 && ($3 == "enc" || $3 == "dec") {print "kernel:" $1, $2, $3, $4}' >> "$D"
  fi
  for b in $BACKENDS; do
    for c in "512 4096 4096" "512 512 4096" "512 512 512" "256 4096 4096"; do
      set -- $c
      taskset -c 0 $CB benchmark --json --backend "$b" --cipher aes-xts-plain64 --key-size "$1" \
        --sector-size "$2" --request-size "$3" --seconds "$SECS" --no-kdf |
        python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); b,k,s,q=sys.argv[1:]
print("%s/%s/%s/%s %s enc %.0f"%(b,k,s,q,s,r["encrypt_mb_s"])); print("%s/%s/%s/%s %s dec %.0f"%(b,k,s,q,s,r["decrypt_mb_s"]))' "$b" "$1" "$2" "$3" >> "$D"
    done
  done
done
python3 - "$D" "$CHOSEN" <<'PY'
import sys, statistics
data, chosen = {}, sys.argv[2]
for line in open(sys.argv[1]):
    name, size, d, v = line.split()
    data.setdefault((name, int(size), d), []).append(float(v))
med = {k: statistics.median(v) for k, v in data.items()}
def m(name, size, d): return med.get((name, size, d), 0)
kernels = sorted({k[0] for k in med if k[0].startswith("kernel:")})
def kbest(size, d): return max([m(k, size, d) for k in kernels] or [0])
def ratio(a, b): return f"{a / b:.2f}×" if a and b else "-"
print("\n| figure (median MB/s; AES-256-XTS unless said) | encrypt | decrypt | ÷ kernel's best (enc / dec) | ÷ OpenSSL (enc / dec) |")
print("|---|---|---|---|---|")
for n in (512, 4096):
    print(f"| openssl speed -evp aes-256-xts -bytes {n} | {m('openssl', n, 'enc'):.0f} | {m('openssl', n, 'dec'):.0f} | | |")
for k in kernels:
    for n in (512, 4096):
        print(f"| kernel {k[7:]}, {n}-byte sectors (one per call) | {m(k, n, 'enc'):.0f} | {m(k, n, 'dec'):.0f} | | |")
labels = {"512/4096/4096": "4096-byte sectors, 4 KiB requests", "512/512/4096": "512-byte sectors, 4 KiB requests",
          "512/512/512": "512-byte sectors, one per call", "256/4096/4096": "AES-128-XTS, 4096-byte sectors, 4 KiB requests"}
for name in sorted({k[0] for k in med if "/" in k[0]}, key=lambda s: (s.split("/")[0] != chosen, s)):
    b, rest = name.split("/", 1)
    n = int(rest.split("/")[1])
    e, d = m(name, n, "enc"), m(name, n, "dec")
    same = not rest.startswith("256/")
    kr = f"{ratio(e, kbest(n, 'enc'))} / {ratio(d, kbest(n, 'dec'))}" if same else ""
    orr = f"{ratio(e, m('openssl', n, 'enc'))} / {ratio(d, m('openssl', n, 'dec'))}" if same else ""
    tag = " (chosen)" if b == chosen else ""
    print(f"| cryptblk {b}{tag}, {labels[rest]} | {e:.0f} | {d:.0f} | {kr} | {orr} |")
print(f"\nBars for the chosen backend ({chosen}): 4096-byte sectors ≥ 1.0× the kernel's best and ≥ 1.7× "
      "OpenSSL's 4096-byte figure; 512-byte sectors in 4 KiB requests ≥ 1.3× the kernel's best per-sector figure.")
PY
