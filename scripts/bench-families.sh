#!/usr/bin/env bash
# The cipher families beyond AES, side by side in one run on this machine (MB = 10^6 B,
# one core, 4096-byte sectors in 4 KiB requests, XTS with 512-bit keys): cryptblk's
# engine (`cryptblk benchmark`) beside libgcrypt's XTS for the same cipher, with its CPU
# extensions on and forced off (its C code; the kernel's generic Serpent, Twofish and
# Camellia are C of the same design). Debian's cryptsetup links OpenSSL, which has no
# Serpent or Twofish at all: without the kernel's AF_ALG, cryptsetup cannot use them.
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
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), libgcrypt $(python3 -c 'import ctypes; g=ctypes.CDLL("libgcrypt.so.20"); g.gcry_check_version.restype=ctypes.c_char_p; print(g.gcry_check_version(None).decode())')"
echo
echo "| cipher (XTS, 512-bit key, 4 KiB) | cryptblk enc / dec | libgcrypt C enc / dec | libgcrypt with CPU extensions | cryptblk ÷ best libgcrypt (enc / dec) |"
echo "|---|---|---|---|---|"
for c in serpent twofish camellia kuznyechik; do
  read -r oe od < <(best ours "$c")
  gname=$(echo "$c" | tr a-z A-Z); [ "$c" = twofish ] || gname="${gname}256"
  if [ "$c" = kuznyechik ]; then
    echo "| $c | $oe / $od | (libgcrypt has none) | | |"
    continue
  fi
  read -r ce cd < <(best python3 "$py" c "$gname")
  read -r he hd < <(best python3 "$py" hw "$gname")
  re=$(python3 -c "print(f'{$oe/max($ce,$he):.2f}')"); rd=$(python3 -c "print(f'{$od/max($cd,$hd):.2f}')")
  echo "| $c | $oe / $od | $ce / $cd | $he / $hd | ${re}x / ${rd}x |"
done
