#!/usr/bin/env bash
# Runs the kernel tests in a throwaway VM (tests/vm/vm.sh: Debian's stock kernel, this
# host's tools): dm-crypt interop and the NBD (kernel nbd-client) and FUSE (loop)
# frontends in one boot, then the ublk frontend (tests/vm/ublk.sh) in a second boot.
set -euo pipefail
cd "$(dirname "$0")/../.."
VM=tests/vm/vm.sh
bash "$VM" setup
# The binary under test: $CRYPTBLK_BIN (scripts/test.sh passes its target/ci/ build), else
# target/release/cryptblk, built if missing.
if [ -n "${CRYPTBLK_BIN:-}" ]; then
  BIN=$CRYPTBLK_BIN
  [ -x "$BIN" ] || { echo "tests/vm: CRYPTBLK_BIN=$BIN is not an executable" >&2; exit 1; }
else
  BIN=$PWD/target/release/cryptblk
  [ -x "$BIN" ] || cargo build --release -p cryptblk
fi
# The guest sees the host's / read-only but has its own /tmp, so hand the scripts and the
# binary over through the results directory (mounted at /results in the guest).
xfer=$(mktemp -d /var/tmp/cryptblk-vm.XXXXXX)
trap 'rm -rf "$xfer"' EXIT
cp tests/vm/dmcrypt-interop.sh tests/vm/frontends.sh tests/vm/ublk.sh "$BIN" "$xfer/"
# A few of cryptsetup's TrueCrypt/VeraCrypt images (scripts/fetch-cryptsetup-images.sh),
# for both-way interop with the kernel's TCRYPT mapping.
tc=target/cryptsetup-tests/tcrypt-images
if [ -d "$tc" ]; then
  mkdir "$xfer/tcrypt"
  cp "$tc"/vc_1-sha512-xts-aes-twofish-serpent "$tc"/vc_1-sha512-xts-camellia "$tc"/tc_2-ripemd160-lrw-aes \
    "$tc"/tc_1-sha1-cbc-cast5 "$tc"/tc_5-sha512-xts-aes-hidden "$tc"/sys_vc_1-sha256-xts-aes "$xfer/tcrypt/"
fi
# Which suites to run: all by default; e.g. CRYPTBLK_VM_TESTS=ublk for the ublk ones only.
SUITES=${CRYPTBLK_VM_TESTS:-dmcrypt ublk}
rc=0
if [[ " $SUITES " == *" dmcrypt "* ]]; then
  echo "== VM: kernel dm-crypt interop, then NBD (nbd-client) and FUSE (loop) against dm-crypt"
  bash "$VM" run -r "$xfer" "bash /results/dmcrypt-interop.sh /results/cryptblk && bash /results/frontends.sh /results/cryptblk" || rc=1
  echo "== VM: first boot done at $SECONDS s"
fi
if [[ " $SUITES " == *" ublk "* ]]; then
  # A second boot, so each suite starts from a clean kernel (no leftover ublk devices).
  echo "== VM: ublk frontend (/dev/ublkbN): filesystems, fio verify, dm-crypt interop, kill -9 + recovery"
  bash "$VM" run -r "$xfer" "bash /results/ublk.sh /results/cryptblk" || rc=1
  echo "== VM: second boot done at $SECONDS s"
fi
[ "$rc" -eq 0 ] || echo "tests/vm: FAILED (see above)" >&2
exit "$rc"
