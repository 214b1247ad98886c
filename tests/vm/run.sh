#!/usr/bin/env bash
# Runs the kernel tests in throwaway VMs (tests/vm/vm.sh: Debian's stock kernel, this
# host's tools), three guests booted at once, each suite on a clean kernel: dm-crypt
# interop (LUKS with AES, a TrueCrypt system partition) then the NBD (kernel nbd-client)
# and FUSE (loop) frontends; dm-crypt interop with the other cipher families, plain,
# loop-AES and TrueCrypt volumes; the ublk frontend (tests/vm/ublk.sh). Emulated (TCG), a
# process costs about as much as the work it does (~6 s a volume in dmcrypt-interop.sh),
# so each volume is formatted by one tool or the other in turn and checks 1 MiB. On two
# host CPUs: 488-531 s (session 24) against 545 s with twice the volumes and a VeraCrypt
# image in the guests (session 23's set). CRYPTBLK_VM_PARALLEL=1 runs them one by one;
# CRYPTBLK_VM_TESTS picks suites ("dmcrypt ublk"). The guests' output is shown once all
# have ended, in this order. The ublk guest also runs on vhost-user-blk disks that cryptblk
# serves on this host (tests/vm/vhost-user-blk.sh: started before the guests, stopped after).
# vCPUs: the ublk guest has two (its multi-queue checks, ublk's and vhost-user-blk's, need
# them); the others one each. Three guests of two vCPUs on two host CPUs spent the
# difference contending: one vCPU each took the dm-crypt guests from 628-659 s to 454-542 s
# (session 33); CRYPTBLK_VM_CPUS gives every guest that many.
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
trap 'stop_vhost_servers 2> /dev/null; rm -rf "$xfer"' EXIT
cp tests/vm/dmcrypt-interop.sh tests/vm/frontends.sh tests/vm/ublk.sh tests/vm/tokens.sh tests/vm/dm-lines.sh \
  tests/vm/vhost-user-blk.sh tests/vm/integrity.sh tests/vm/package.sh "$BIN" "$xfer/"
# The Debian package of this binary, installed and purged in the interop guest.
deb=$(bash scripts/build-deb.sh "$BIN" "$xfer/deb")
mv "$deb" "$xfer/cryptblk.deb"
# The software FIDO2 key the token tests plug in (a test tool with its own lock file,
# never linked into cryptblk: tests/tools/fido2-authenticator). Built here; tokens.sh says
# FAIL if it is missing.
if [[ " ${CRYPTBLK_VM_TESTS:-dmcrypt ublk} " == *" ublk "* ]]; then
  fa=tests/tools/fido2-authenticator
  if cargo build --release --quiet --locked --manifest-path "$fa/Cargo.toml" --target-dir target/test-tools; then
    cp target/test-tools/release/fido2-authenticator "$xfer/"
  else
    echo "tests/vm: the software FIDO2 key ($fa) did not build: the FIDO2 token checks will fail" >&2
  fi
fi
# compat-test's own LUKS1 image, for its lines that need a mapping (dm-lines.sh says FAIL
# if it is missing).
if [ -f target/cryptsetup-src/tests/compatimage.img.xz ]; then cp target/cryptsetup-src/tests/compatimage.img.xz "$xfer/"; fi
# A few of cryptsetup's TrueCrypt/VeraCrypt images (scripts/fetch-cryptsetup-images.sh),
# for both-way interop with the kernel's TCRYPT mapping.
tc=target/cryptsetup-tests/tcrypt-images
if [ -d "$tc" ]; then
  mkdir "$xfer/tcrypt"
  cp "$tc"/tc_5-sha512-xts-aes-twofish-serpent "$tc"/tc_2-ripemd160-lrw-aes \
    "$tc"/tc_1-sha1-cbc-cast5 "$tc"/tc_5-sha512-xts-aes-hidden "$tc"/sys_vc_1-sha256-xts-aes "$xfer/tcrypt/"
fi
# Which suites to run: all by default; e.g. CRYPTBLK_VM_TESTS=ublk for the ublk ones only.
SUITES=${CRYPTBLK_VM_TESTS:-dmcrypt ublk}
PARALLEL=${CRYPTBLK_VM_PARALLEL:-3}
[[ $PARALLEL =~ ^[1-9][0-9]*$ ]] || { echo "tests/vm: CRYPTBLK_VM_PARALLEL=$PARALLEL: a count of 1 or more" >&2; exit 2; }
names=() titles=() cmds=() tpms=() vubs=() cpus=()
# guest NAME TITLE COMMAND VCPUS [tpm] [VHOST_USER_BLK]: "tpm" gives the guest a TPM 2.0
# (vm.sh's CRYPTBLK_VM_TPM); VHOST_USER_BLK, vhost-user-blk disks (vm.sh's
# CRYPTBLK_VM_VHOST_USER_BLK).
guest() {
  names+=("$1"); titles+=("$2"); cmds+=("$3"); cpus+=("${CRYPTBLK_VM_CPUS:-$4}"); tpms+=("${5:-}"); vubs+=("${6:-}")
}
vub_started=
stop_vhost_servers() { [ -z "$vub_started" ] || bash tests/vm/vhost-user-blk.sh host-stop "$xfer" "$xfer/cryptblk"; vub_started=; }
if [[ " $SUITES " == *" dmcrypt "* ]]; then
  guest interop "kernel dm-crypt interop (LUKS with AES, a TrueCrypt system partition), then NBD (nbd-client) and FUSE (loop) against dm-crypt; LUKS2 with integrity both ways with dm-integrity (tests/vm/integrity.sh); the Debian package installed, used and purged (tests/vm/package.sh)" \
    "bash /results/dmcrypt-interop.sh /results/cryptblk luks tcrypt-system && bash /results/frontends.sh /results/cryptblk; u=\$?; bash /results/integrity.sh /results/cryptblk luks2 || u=1; bash /results/package.sh /results/cryptblk.deb && exit \$u" 1
  # cryptsetup's test lines that need a mapping run over ublk here: the ublk guest is the
  # longest already.
  guest families "kernel dm-crypt interop: the other cipher families, plain, loop-AES, TrueCrypt volumes; standalone integritysetup volumes both ways with dm-integrity (tests/vm/integrity.sh); cryptsetup's test lines that need a mapping (over ublk)" \
    "bash /results/dmcrypt-interop.sh /results/cryptblk families plain loopaes tcrypt; u=\$?; bash /results/integrity.sh /results/cryptblk standalone || u=1; bash /results/dm-lines.sh /results/cryptblk /results/compatimage.img.xz && exit \$u" 1
fi
if [[ " $SUITES " == *" ublk "* ]]; then
  # The vhost-user-blk servers run on this host, started before the guest boots
  # (tests/vm/vhost-user-blk.sh).
  vub=$(bash tests/vm/vhost-user-blk.sh host-start "$xfer" "$xfer/cryptblk") || { echo "tests/vm: the vhost-user-blk servers did not start" >&2; exit 1; }
  vub_started=1
  guest ublk "ublk frontend (/dev/ublkbN): filesystems, fio verify, dm-crypt interop, kill -9 + recovery; TPM2 (PCR and signed policies) and FIDO2 tokens against systemd's own unlock path; a VM on cryptblk's vhost-user-blk disks (LUKS2, BitLocker, VeraCrypt; kill -9 and reconnect)" \
    "bash /results/ublk.sh /results/cryptblk; u=\$?; bash /results/tokens.sh /results/cryptblk /results/fido2-authenticator || u=1; bash /results/vhost-user-blk.sh guest /results && exit \$u" 2 tpm "$vub"
fi
# The guests only read /results (they work in their own /tmp), so they share it.
logs=$(mktemp -d /var/tmp/cryptblk-vm-logs.XXXXXX)
# Each guest runs in a session of its own: stopped (a CI cancel), this script takes its
# QEMU down with it rather than leave it running over a deleted /results.
stop_guests() {
  local f
  for f in "$logs"/*.pid; do [ -f "$f" ] && kill -- "-$(cat "$f")" 2>/dev/null; done
  wait 2>/dev/null
  stop_vhost_servers
  rm -rf "$xfer" "$logs"
}
trap stop_guests EXIT
trap 'exit 143' TERM INT
for i in "${!names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n || true; done
  echo "== VM ${names[$i]}: booting at $SECONDS s: ${titles[$i]}"
  ( set +e; CRYPTBLK_VM_CPUS=${cpus[$i]} CRYPTBLK_VM_TPM=${tpms[$i]:+1} CRYPTBLK_VM_VHOST_USER_BLK=${vubs[$i]} setsid bash "$VM" run -r "$xfer" "${cmds[$i]}" > "$logs/$i.log" 2>&1 < /dev/null &
    echo $! > "$logs/$i.pid"; wait $!
    echo $? > "$logs/$i.rc"; rm -f "$logs/$i.pid"
    echo "== VM ${names[$i]}: ended at $SECONDS s (exit $(cat "$logs/$i.rc"))" ) &
done
wait
stop_vhost_servers
rc=0
for i in "${!names[@]}"; do
  echo "== VM ${names[$i]}: ${titles[$i]}"
  cat "$logs/$i.log"
  r=$(cat "$logs/$i.rc" 2>/dev/null || echo 125)
  [ "$r" -eq 0 ] || { echo "== VM ${names[$i]}: FAILED (exit $r)"; rc=1; }
done
echo "== VM: all guests done at $SECONDS s"
[ "$rc" -eq 0 ] || echo "tests/vm: FAILED (see above)" >&2
exit "$rc"
