#!/usr/bin/env bash
# Runs INSIDE the test VM (tests/vm/vm.sh with CRYPTBLK_VM_TPM=1: QEMU's TPM 2.0 over a
# host swtpm, /dev/tpmrm0 in the guest), as root. systemd's own TPM2 unlock path beside
# cryptblk's, both ways: cryptblk enrolls, and cryptsetup's systemd-tpm2 plugin (which
# only reaches a kernel TPM) maps the volume with dm-crypt, no passphrase; systemd-
# cryptenroll enrolls, and cryptblk opens it with --tpm2-device auto (the first
# /dev/tpmrm*). Then a PCR moves and both refuse.
# usage: tokens.sh /path/to/cryptblk
set -uo pipefail
CB=$1
modprobe tpm_tis 2>/dev/null
modprobe dm_crypt 2>/dev/null
modprobe loop 2>/dev/null
cd /tmp
pass=0; fail=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then pass=$((pass+1)); echo "ok   $name"; else fail=$((fail+1)); echo "FAIL $name"; fi
}
quiet() { "$@" > /tmp/quiet.out 2>&1 || { tail -20 /tmp/quiet.out; false; }; }
for _ in $(seq 50); do [ -e /dev/tpmrm0 ] && break; sleep 0.1; done
if [ ! -e /dev/tpmrm0 ]; then
  echo "FAIL tokens: no /dev/tpmrm0 in the guest (QEMU's -tpmdev, tpm_tis)"
  exit 1
fi
echo "== tokens: systemd-tpm2 both ways (at ${SECONDS}s)"
printf 'recovery passphrase' > pw
truncate -s 32M v.img
quiet cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw v.img
head -c 1M /dev/urandom > data
quiet "$CB" import v.img data --key-file pw
check "cryptblk enrolls on /dev/tpmrm0 (PCR 7)" quiet "$CB" enroll --tpm2-device auto --key-file pw v.img
L=$(losetup -f --show v.img)
check "cryptsetup's systemd-tpm2 plugin maps cryptblk's enrollment, no passphrase" \
  quiet cryptsetup open --token-only "$L" tokvol < /dev/null
check "the mapping reads the data cryptblk wrote" cmp -n 1048576 data /dev/mapper/tokvol
cryptsetup close tokvol 2>/dev/null
losetup -d "$L"
check "systemd-cryptenroll takes cryptblk's PCR 7 enrollment for its own (no-op)" \
  bash -c "PASSWORD='recovery passphrase' systemd-cryptenroll --tpm2-device=auto --tpm2-pcrs=7 v.img 2>&1 | grep -q 'already enrolled'"
check "systemd-cryptenroll enrolls (PCRs 0 and 7)" \
  quiet env PASSWORD="recovery passphrase" systemd-cryptenroll --tpm2-device=auto --tpm2-pcrs=0+7 v.img
check "cryptblk opens systemd's enrollment through /dev/tpmrm0 (auto)" \
  quiet "$CB" test-passphrase --token-only --token-id 1 v.img < /dev/null
check "PCR 7 extended" quiet tpm2_pcrextend "7:sha256=$(printf '01%.0s' $(seq 32))"
check "cryptsetup's plugin refuses after the PCR moved" \
  bash -c "! cryptsetup open --test-passphrase --token-only v.img < /dev/null > /dev/null 2>&1"
check "cryptblk refuses after the PCR moved, and says why" \
  bash -c "! '$CB' test-passphrase --token-only v.img < /dev/null 2> err && grep -q 'PCRs do not hold' err"
echo "tokens: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
