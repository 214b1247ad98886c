#!/usr/bin/env bash
# The cipher families beyond AES, side by side in one run on this machine (MB = 10^6 B,
# one core, 4096-byte sectors in 4 KiB requests, XTS with 512-bit keys): cryptblk's
# engine (`cryptblk benchmark`) beside the kernel's generic C Serpent and Twofish
# (crypto/serpent_generic.c, twofish_*.c from Debian's newest linux-source package,
# compiled unchanged in userspace by scripts/kernel-generic/, in XTS as crypto/xts.c runs
# it; checked to encrypt as cryptblk does first) and libgcrypt's XTS for the same cipher,
# with its CPU extensions on and forced off. Debian's cryptsetup links OpenSSL, which has
# no Serpent or Twofish at all: without the kernel's AF_ALG, cryptsetup cannot use them.
# Kernel sources and the harness binary go to $KGEN_CACHE (default
# /var/cache/cryptblk-kgen: root, or set KGEN_CACHE), never the repository. The stubs
# fit linux-source 6.12 and later (<linux/unaligned.h>).
# Usage: scripts/bench-families.sh [ROUNDS]   (best of ROUNDS, default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
cargo build --release -q -p cryptblk
BIN=target/release/cryptblk
py=$(mktemp)
trap 'rm -f "$py"' EXIT
cat > "$py" <<'PY'
import ctypes, sys, time
hw = sys.argv[1] == "hw"
g = ctypes.CDLL("libgcrypt.so.20")
if not hw:  # GCRYCTL_DISABLE_HWF before initialisation: libgcrypt's C code only
    for f in ["intel-avx512", "intel-vaes-vpclmul", "intel-avx2", "intel-avx", "intel-ssse3",
              "intel-sse4.1", "intel-aesni", "intel-pclmul", "intel-gfni", "intel-bmi2"]:
        g.gcry_control(63, ctypes.c_char_p(f.encode()), None)
g.gcry_check_version.restype = ctypes.c_char_p
g.gcry_check_version(None)
algo = g.gcry_cipher_map_name(sys.argv[2].encode())
h = ctypes.c_void_p()
assert g.gcry_cipher_open(ctypes.byref(h), algo, 13, 0) == 0  # GCRY_CIPHER_MODE_XTS
assert g.gcry_cipher_setkey(h, bytes(range(64)), 64) == 0
buf, iv = ctypes.create_string_buffer(4096), ctypes.create_string_buffer(16)
out = []
for op in (g.gcry_cipher_encrypt, g.gcry_cipher_decrypt):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        for _ in range(64):
            g.gcry_cipher_setiv(h, iv, 16)
            op(h, buf, 4096, None, 0)
        n += 64
    out.append(n * 4096 / (time.perf_counter() - t0) / 1e6)
print(f"{out[0]:.0f} {out[1]:.0f}")
PY
best() { # command... -> "enc dec", best of $rounds
  local e=0 d=0 a b
  for _ in $(seq "$rounds"); do
    read -r a b < <("$@")
    e=$(python3 -c "print(max($e, $a))"); d=$(python3 -c "print(max($d, $b))")
  done
  echo "$e $d"
}
ours() {
  "$BIN" benchmark --no-kdf --json -c "$1-xts-plain64" -s 512 --sector-size 4096 --request-size 4096 --seconds 0.5 |
    python3 -c 'import json,sys; r=json.loads(sys.stdin.readlines()[-1]); print(round(r["encrypt_mb_s"]), round(r["decrypt_mb_s"]))'
}
# The kernel's generic C ciphers, built once.
KGEN=${KGEN_CACHE:-/var/cache/cryptblk-kgen}
kpkg=$(apt-cache search --names-only '^linux-source-[0-9.]+$' | awk '{print $1}' | sort -V | tail -n1)
[ -n "$kpkg" ] || { echo "bench-families: no linux-source package" >&2; exit 1; }
kversion=$(apt-cache policy "$kpkg" | awk '/Candidate/{print $2}')
ksrc="$KGEN/$kpkg-$kversion"   # one folder per version: the label is what was compiled
if [ ! -f "$ksrc/.ready" ]; then
  mkdir -p "$ksrc"; chown _apt "$KGEN" 2>/dev/null || true
  (cd "$KGEN" && apt-get download "$kpkg" >&2)
  dpkg-deb --fsys-tarfile "$KGEN/${kpkg}_"*.deb | tar -xO --wildcards "*/$kpkg.tar.xz" |
    tar -xJ -C "$ksrc" --strip-components=1 --wildcards '*/crypto/serpent_generic.c' \
      '*/crypto/twofish_generic.c' '*/crypto/twofish_common.c' '*/include/crypto/serpent.h' '*/include/crypto/twofish.h'
  rm -f "$KGEN/${kpkg}_"*.deb
  touch "$ksrc/.ready"
fi
gcc -O2 -I scripts/kernel-generic/stub -I "$ksrc/include" -I "$ksrc/crypto" \
  -o "$KGEN/bench" scripts/kernel-generic/bench.c
# The build must encrypt as cryptblk does: sector 0 of zeros, key 00 01 .. 3f.
kdir=$(mktemp -d)
trap 'rm -f "$py"; rm -rf "$kdir"' EXIT
python3 -c "open('$kdir/key', 'wb').write(bytes(range(64)))"
head -c 512 /dev/zero > "$kdir/zeros"
"$KGEN/bench" 0 check > "$kdir/check"
[ "$(wc -l < "$kdir/check")" -eq 2 ] || { echo "bench-families: the kernel build printed no check values" >&2; exit 1; }
while read -r c want; do
  truncate -s 1M "$kdir/img"
  "$BIN" import -q --type plain --cipher "$c-xts-plain64" --key-size 512 --key-file "$kdir/key" "$kdir/img" "$kdir/zeros" >/dev/null
  got=$(head -c 16 "$kdir/img" | od -An -tx1 | tr -d ' \n')
  [ "$got" = "$want" ] || { echo "bench-families: kernel $c build disagrees with cryptblk ($want vs $got)" >&2; exit 1; }
done < "$kdir/check"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), libgcrypt $(python3 -c 'import ctypes; g=ctypes.CDLL("libgcrypt.so.20"); g.gcry_check_version.restype=ctypes.c_char_p; print(g.gcry_check_version(None).decode())'), kernel $kversion ($kpkg)"
echo
echo "| cipher (XTS, 512-bit key, 4 KiB) | cryptblk enc / dec | kernel generic C enc / dec | cryptblk ÷ kernel (enc / dec) | libgcrypt C enc / dec | libgcrypt with CPU extensions | cryptblk ÷ best libgcrypt (enc / dec) |"
echo "|---|---|---|---|---|---|---|"
for c in serpent twofish camellia kuznyechik; do
  read -r oe od < <(best ours "$c")
  gname=$(echo "$c" | tr a-z A-Z); [ "$c" = twofish ] || gname="${gname}256"
  kern="| (not measured) | "
  if [ "$c" = serpent ] || [ "$c" = twofish ]; then
    read -r ke kd < <(best "$KGEN/bench" 0.5 "$c")
    kern="| $ke / $kd | $(python3 -c "print(f'{$oe/$ke:.2f}x / {$od/$kd:.2f}x')") "
  fi
  if [ "$c" = kuznyechik ]; then
    echo "| $c | $oe / $od $kern| (libgcrypt has none) | | |"
    continue
  fi
  read -r ce cd < <(best python3 "$py" c "$gname")
  read -r he hd < <(best python3 "$py" hw "$gname")
  re=$(python3 -c "print(f'{$oe/max($ce,$he):.2f}')"); rd=$(python3 -c "print(f'{$od/max($cd,$hd):.2f}')")
  echo "| $c | $oe / $od $kern| $ce / $cd | $he / $hd | ${re}x / ${rd}x |"
done
