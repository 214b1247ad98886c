#!/usr/bin/env bash
# The AVX-512 units cryptblk's sector engines use, measured on this CPU (see units.c).
# Needs gcc and a CPU with AVX-512F, VAES and VPCLMULQDQ.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
grep -m1 "model name" /proc/cpuinfo
gcc -O2 -fno-tree-loop-distribute-patterns -mavx512f -mavx512bw -mvaes -maes -mvpclmulqdq -o "$OUT/units" "$HERE/units.c"
"$OUT/units"
