#!/usr/bin/env bash
# The kernel's own x86 AES-GCM assembly (Linux 6.12, from Debian's linux-source-6.12
# package, assembled unchanged) against cryptblk's aes-gcm-random sector engine, in one
# run on this CPU: what dm-crypt's `--integrity aead` with aes-gcm-random costs per sector
# without the kernel around it, beside `cryptblk benchmark --integrity aead`.
#   [ROUNDS=3] scripts/kernel-gcm-bench/run.sh [seconds per figure, default 1] [cryptblk binary]
# The kernel source and the benchmark binary go to $KERNEL_BENCH_CACHE (default
# /var/cache/kernel-gcm-bench), never into the repository. Needs gcc and libssl-dev
# (installed if missing, as root) and the network once, for the package.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
SECS=${1:-1}
CB=${2:-$HERE/../../target/release/cryptblk}
[ -x "$CB" ] || { echo "kernel-gcm-bench: no cryptblk at $CB (cargo build --release)" >&2; exit 2; }
WORK=${KERNEL_BENCH_CACHE:-/var/cache/kernel-gcm-bench}
PKG=linux-source-6.12
need=""
for p in gcc libssl-dev xz-utils; do
  dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q 'ok installed' || need="$need $p"
done
[ -z "$need" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >&2
mkdir -p "$WORK"
if [ ! -f "$WORK/src/.ready" ]; then
  chown _apt "$WORK" 2>/dev/null || true
  (cd "$WORK" && apt-get download "$PKG" >&2)
  rm -rf "$WORK/src"; mkdir -p "$WORK/src"
  dpkg-deb --fsys-tarfile "$WORK/${PKG}_"*.deb | tar -xO --wildcards "*/$PKG.tar.xz" |
    tar -xJ -C "$WORK/src" --strip-components=4 --wildcards \
      '*/arch/x86/crypto/aes-gcm-aesni-x86_64.S' '*/arch/x86/crypto/aes-gcm-avx10-x86_64.S' \
      '*/arch/x86/crypto/aesni-intel_asm.S'
  dpkg-deb -f "$WORK/${PKG}_"*.deb Version > "$WORK/src/version"
  rm -f "$WORK/${PKG}_"*.deb
  touch "$WORK/src/.ready"
fi
gcc -O2 -DCONFIG_AS_VAES -DCONFIG_AS_VPCLMULQDQ -Wall -Wa,--noexecstack -I"$HERE/stub" \
  -o "$WORK/gcm-bench" "$HERE/gcm-bench.c" "$WORK/src/aes-gcm-aesni-x86_64.S" \
  "$WORK/src/aes-gcm-avx10-x86_64.S" "$WORK/src/aesni-intel_asm.S" -lcrypto
echo "# CPU:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); kernel source $(cat "$WORK/src/version" 2>/dev/null || echo "$PKG")"
# ROUNDS alternating runs of the kernel's drivers and of cryptblk's engine; medians, and
# each of cryptblk's figures over the kernel's fastest driver at the same sector size.
python3 - "$WORK/gcm-bench" "$CB" "$SECS" "${ROUNDS:-3}" <<'PY'
import json, statistics, subprocess, sys
bench, cb, secs, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kernel, ours = {}, {}
for _ in range(rounds):
    out = subprocess.run([bench, secs], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) >= 5 and f[-3] in ("seal", "open"):
            kernel.setdefault((f[0], int(f[-4]), f[-3]), []).append(float(f[-2]))
        else:
            print("# kernel:", line)
    for ss, req in ((4096, 4096), (4096, 131072), (512, 131072)):
        out = subprocess.run([cb, "benchmark", "--integrity", "aead", "--cipher", "aes-gcm-random",
                              "--key-size", "256", "--sector-size", str(ss), "--request-size",
                              str(req), "--seconds", secs, "--json"],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out)
        ours.setdefault((ss, req), []).append((r["encrypt_mb_s"], r["decrypt_mb_s"]))
med = statistics.median
print(f"## The kernel's AES-256-GCM, one call sequence per sector as dm-crypt makes it (MB/s, median of {rounds})")
print("| driver | sector | seal | open |")
print("|---|---|---|---|")
best = {}
for (drv, ss, d), v in sorted(kernel.items()):
    m = med(v)
    if m > best.get((ss, d), (0, ""))[0]:
        best[(ss, d)] = (m, drv)
for drv in dict.fromkeys(k[0] for k in sorted(kernel)):
    for ss in (512, 4096):
        if (drv, ss, "seal") in kernel:
            print(f"| {drv} | {ss} | {med(kernel[(drv, ss, 'seal')]):.0f} | {med(kernel[(drv, ss, 'open')]):.0f} |")
print()
print(f"## cryptblk benchmark --integrity aead --cipher aes-gcm-random (MB/s, median of {rounds})")
print("| sector | request | seal | ÷ kernel's best | open | ÷ kernel's best |")
print("|---|---|---|---|---|---|")
for (ss, req), v in ours.items():
    s, o = med([x[0] for x in v]), med([x[1] for x in v])
    ks, ko = best[(ss, "seal")], best[(ss, "open")]
    print(f"| {ss} | {req} | {s:.0f} | {s / ks[0]:.2f} ({ks[1]}) | {o:.0f} | {o / ko[0]:.2f} ({ko[1]}) |")
PY
