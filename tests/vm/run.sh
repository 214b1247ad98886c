#!/usr/bin/env bash
# Runs the kernel interop tests in ../shared/vmlab (a throwaway VM with dm-crypt, nbd and
# fuse): dm-crypt both ways, then the NBD (kernel nbd-client) and FUSE (loop) frontends.
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
# The guest sees the host's / read-only but has its own /tmp, so hand the script and the
# binary over through the results directory (mounted at /results in the guest).
xfer=$(mktemp -d /var/tmp/cryptblk-vm.XXXXXX)
trap 'rm -rf "$xfer"' EXIT
cp tests/vm/dmcrypt-interop.sh tests/vm/frontends.sh "$BIN" "$xfer/"
VMLAB_TIMEOUT=${VMLAB_TIMEOUT:-1200} "$VMLAB" run -r "$xfer" "bash /results/dmcrypt-interop.sh /results/cryptblk && bash /results/frontends.sh /results/cryptblk"
