#!/usr/bin/env bash
# The AVX-512 units cryptblk's sector engines use, measured on this CPU (see units.c), and
# whether SHA-NI runs beside the sixteen SHA-256 lanes (sha-lanes.c).
# Needs gcc and a CPU with AVX-512F, VAES, VPCLMULQDQ and the SHA extensions.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
grep -m1 "model name" /proc/cpuinfo
gcc -O2 -fno-tree-loop-distribute-patterns -mavx512f -mavx512bw -mvaes -maes -mvpclmulqdq \
  -o "$OUT/units" "$HERE/units.c"
"$OUT/units"
echo
gcc -O2 -mavx512f -mavx512bw -msha -mssse3 -msse4.1 -o "$OUT/sha-lanes" "$HERE/sha-lanes.c"
"$OUT/sha-lanes"
