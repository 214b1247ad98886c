#!/usr/bin/env bash
# Runs the kernel interop tests in ../shared/vmlab (a throwaway VM with dm-crypt).
set -euo pipefail
cd "$(dirname "$0")/../.."
VMLAB=${VMLAB:-../shared/vmlab/vmlab}
if [ ! -x "$VMLAB" ]; then
  echo "tests/vm: vmlab not found at $VMLAB: the kernel interop tests cannot run" >&2
  exit 1
fi
[ -e /dev/kvm ] || echo "tests/vm: NOTE: no /dev/kvm here; vmlab emulates the CPU (slow but functional)" >&2
"$VMLAB" setup >/dev/null
BIN=$PWD/target/release/cryptblk
[ -x "$BIN" ] || cargo build --release -p cryptblk
VMLAB_TIMEOUT=${VMLAB_TIMEOUT:-1200} "$VMLAB" run "bash $PWD/tests/vm/dmcrypt-interop.sh $BIN"
