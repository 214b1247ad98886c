#!/usr/bin/env bash
# Runs INSIDE the test VM (tests/vm/vm.sh with CRYPTBLK_VM_TPM=1: QEMU's TPM 2.0 over a
# host swtpm, /dev/tpmrm0 in the guest), as root. systemd's own TPM2 unlock path beside
# cryptblk's, both ways: cryptblk enrolls, and cryptsetup's systemd-tpm2 plugin (which
# only reaches a kernel TPM) maps the volume with dm-crypt, no passphrase; systemd-
# cryptenroll enrolls, and cryptblk opens it with --tpm2-device auto (the first
# /dev/tpmrm*). Then a PCR moves and both refuse. The same for a signed PCR policy
# (systemd-measure's signature of PCR 11, systemd-cryptenroll --tpm2-public-key). Then FIDO2, over a software security
# key on a virtual HID device (uhid; tests/tools/fido2-authenticator): systemd-cryptenroll
# enrolls and cryptblk unlocks; cryptblk enrolls and cryptsetup's systemd-fido2 plugin maps
# the volume; a wrong PIN, the token's flags, and a second key without the credential.
# usage: tokens.sh /path/to/cryptblk [/path/to/fido2-authenticator]
set -uo pipefail
CB=$1
FA=${2:-}
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

echo "== tokens: systemd-tpm2 signed PCR policies both ways (at ${SECONDS}s)"
# PCR 11 as a signed kernel image's boot leaves it (systemd-stub's measurements, then the
# enter-initrd phase), signed by systemd-measure; the signature where systemd looks first.
quiet openssl genrsa -out pcr.key 2048
quiet openssl rsa -in pcr.key -pubout -out pcr.pub
printf 'a kernel image, as far as PCR 11 is concerned' > kernel
h() { sha256sum | cut -d' ' -f1; }
measure() {
  tpm2_pcrextend "11:sha256=$(printf '.linux\0' | h)" && tpm2_pcrextend "11:sha256=$(h < kernel)" &&
    tpm2_pcrextend "11:sha256=$(printf 'enter-initrd' | h)"
}
mkdir -p /run/systemd
check "systemd-measure signs the boot's PCR 11" bash -c \
  "/usr/lib/systemd/systemd-measure sign --tpm2-device=/dev/tpmrm0 --linux=kernel --bank=sha256 --phase=enter-initrd --private-key=pcr.key --public-key=pcr.pub > /run/systemd/tpm2-pcr-signature.json"
check "PCR 11 measured as that boot" quiet measure
truncate -s 32M s.img
quiet cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw s.img
quiet "$CB" import s.img data --key-file pw
check "cryptblk enrolls a signed policy (PCR 11 by pcr.pub, no literal PCRs)" \
  quiet "$CB" enroll --tpm2-device auto --tpm2-public-key pcr.pub --tpm2-pcrs "" --key-file pw s.img
L=$(losetup -f --show s.img)
check "cryptsetup's systemd-tpm2 plugin maps it with the signature, no passphrase" \
  quiet cryptsetup open --token-only "$L" sigvol < /dev/null
check "the mapping reads the data cryptblk wrote" cmp -n 1048576 data /dev/mapper/sigvol
cryptsetup close sigvol 2>/dev/null
losetup -d "$L"
check "systemd-cryptenroll takes cryptblk's signed enrollment for its own (no-op)" \
  bash -c "PASSWORD='recovery passphrase' systemd-cryptenroll --tpm2-device=auto --tpm2-public-key=pcr.pub --tpm2-pcrs= s.img 2>&1 | grep -q 'already enrolled'"
truncate -s 32M s2.img
quiet cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw s2.img
check "systemd-cryptenroll enrolls a signed policy" \
  quiet env PASSWORD="recovery passphrase" systemd-cryptenroll --tpm2-device=auto --tpm2-public-key=pcr.pub --tpm2-pcrs= s2.img
check "cryptblk opens systemd's signed enrollment (signature found where systemd looks)" \
  quiet "$CB" test-passphrase --token-only s2.img < /dev/null
check "PCR 11 moves past what was signed" quiet tpm2_pcrextend "11:sha256=$(printf '02%.0s' $(seq 32))"
check "cryptsetup's plugin refuses after PCR 11 moved" \
  bash -c "! cryptsetup open --test-passphrase --token-only s.img < /dev/null > /dev/null 2>&1"
check "cryptblk refuses after PCR 11 moved, and says why" \
  bash -c "! '$CB' test-passphrase --token-only s2.img < /dev/null 2> err && grep -q 'nobody signed' err"
rm -f /run/systemd/tpm2-pcr-signature.json

echo "== tokens: systemd-fido2 both ways (at ${SECONDS}s)"
fido_keys=()
stop_keys() { for k in "${fido_keys[@]}"; do kill "$k" 2>/dev/null; done; }
trap stop_keys EXIT
# start_key NAME [ARGS]: a software FIDO2 key; its hidraw path in $KEY_PATH.
start_key() {
  local name=$1; shift
  local before; before=$(ls /sys/class/hidraw 2>/dev/null)
  "$FA" "$@" > "$name.out" 2> "$name.log" &
  fido_keys+=($!)
  KEY_PATH=
  for _ in $(seq 100); do
    for h in $(ls /sys/class/hidraw 2>/dev/null); do
      case " $(echo $before) " in *" $h "*) ;; *) [ -e "/dev/$h" ] && KEY_PATH=/dev/$h ;; esac
    done
    [ -n "$KEY_PATH" ] && return 0
    sleep 0.1
  done
  echo "no hidraw device from $FA: $(cat "$name.log")"
  return 1
}
if [ -z "$FA" ] || [ ! -x "$FA" ]; then
  echo "FAIL fido2: no software FIDO2 key to test with (tests/tools/fido2-authenticator was not built)"
  fail=$((fail+1))
elif ! modprobe uhid 2>/dev/null || ! { modprobe hid_generic 2>/dev/null; start_key key1 --pin 4321; }; then
  echo "FAIL fido2: the guest cannot make a virtual HID device (uhid, hid-generic)"
  fail=$((fail+1))
else
  KEY1=$KEY_PATH
  printf 'recovery passphrase' > pw
  truncate -s 32M f.img
  quiet cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw f.img
  quiet "$CB" import f.img data --key-file pw
  # systemd-cryptenroll 252 takes the key's PIN from a credential only (no $PIN).
  mkdir -p creds && printf 4321 > creds/fido2-pin
  check "systemd-cryptenroll enrolls the FIDO2 key (PIN and presence)" \
    quiet env PASSWORD="recovery passphrase" CREDENTIALS_DIRECTORY=$PWD/creds \
    systemd-cryptenroll --fido2-device="$KEY1" f.img
  check "cryptblk unlocks systemd's FIDO2 enrollment with the PIN" \
    quiet env PIN=4321 "$CB" test-passphrase --token-only --token-type systemd-fido2 f.img
  check "a wrong PIN: refused with exit 2, and said so" bash -c \
    "PIN=0000 '$CB' test-passphrase --token-only f.img < /dev/null 2> err; rc=\$?; [ \$rc -eq 2 ] && grep -q 'wrong PIN' err"
  check "cryptblk's dump prints systemd's FIDO2 token as cryptsetup's luksDump does" \
    bash -c "cryptsetup luksDump f.img > cs.dump && '$CB' dump f.img > cb.dump && diff cs.dump cb.dump"
  check "cryptblk enrolls the key (PIN and presence, as systemd does)" \
    quiet env PIN=4321 "$CB" enroll --fido2-device "$KEY1" --key-file pw f.img
  check "... a token with systemd's fields and values, but for the credential and salt" bash -c \
    "for t in 0 1; do '$CB' token export --token-id \$t f.img | jq -S -c 'del(.[\"fido2-credential\", \"fido2-salt\", \"keyslots\"])'; done | uniq | wc -l | grep -qx 1"
  L=$(losetup -f --show f.img)
  check "cryptsetup's systemd-fido2 plugin maps cryptblk's enrollment with the PIN" \
    bash -c "printf 4321 | cryptsetup open --token-only --token-id 1 '$L' fidovol > plugin.out 2>&1 || { cat plugin.out; false; }"
  check "the mapping reads the data cryptblk wrote" cmp -n 1048576 data /dev/mapper/fidovol
  cryptsetup close fidovol 2>/dev/null
  losetup -d "$L"
  check "cryptblk enrolls without PIN or presence" quiet "$CB" enroll --fido2-device "$KEY1" \
    --fido2-with-client-pin=no --fido2-with-user-presence=no --key-file pw f.img
  check "... the token says so" bash -c "'$CB' token export --token-id 2 f.img > t2.json &&
    grep -q '\"fido2-clientPin-required\":false' t2.json && grep -q '\"fido2-up-required\":false' t2.json"
  : > key1.log
  check "... cryptblk unlocks it with no PIN and no touch" \
    quiet env -u PIN "$CB" test-passphrase --token-only --token-id 2 f.img < /dev/null
  check "... and the key was not asked for presence" bash -c "! grep -q 'up requested' key1.log"
  check "... and systemd's plugin too" \
    quiet cryptsetup open --test-passphrase --token-only --token-id 2 f.img < /dev/null
  check "cryptblk enrolls with presence and no PIN" quiet "$CB" enroll --fido2-device "$KEY1" \
    --fido2-with-client-pin=no --key-file pw f.img
  : > key1.log
  check "... cryptblk unlocks it with a touch and no PIN" \
    quiet env -u PIN "$CB" test-passphrase --token-only --token-id 3 f.img < /dev/null
  check "... and the key was asked for presence" grep -q "up requested" key1.log
  check "a token as systemd 248 wrote it (no flags) unlocks, the key's defaults taken" bash -c \
    "'$CB' token export --token-id 3 f.img | jq -c 'del(.[\"fido2-clientPin-required\", \"fido2-up-required\", \"fido2-uv-required\", \"fido2-rp\"])' > t248.json &&
     cryptsetup token import --token-id 4 --json-file t248.json f.img &&
     env -u PIN '$CB' test-passphrase --token-only --token-id 4 f.img < /dev/null"
  # Two keys: a decoy with a PIN of its own, listed first, that never saw the credential;
  # the key that did, listed second. The decoy must not be sent the PIN (it would count
  # it as a wrong one) nor asked for a touch.
  stop_keys; fido_keys=()
  if start_key decoy --pin 9999 && DECOY=$KEY_PATH && start_key key3 --pin 4321; then
    KEY3=$KEY_PATH
    check "two keys: cryptblk enrolls the second (PIN)" \
      quiet env PIN=4321 "$CB" enroll --fido2-device "$KEY3" --key-file pw f.img
    : > decoy.log
    check "two keys: cryptblk passes the decoy ($DECOY) over and unlocks with the other ($KEY3)" \
      quiet env PIN=4321 "$CB" test-passphrase --token-only --token-id 5 f.img < /dev/null
    check "... the decoy was asked whether it holds the credential" grep -q "command 0x02" decoy.log
    check "... and was never sent the PIN nor asked for a touch" \
      bash -c "! grep -qE 'command 0x06|up requested' decoy.log"
  else
    fail=$((fail+1)); echo "FAIL two software FIDO2 keys at once"
  fi
  stop_keys
fi
echo "tokens: $pass passed, $fail failed (at ${SECONDS}s)"
[ "$fail" -eq 0 ]
