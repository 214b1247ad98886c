#!/usr/bin/env bash
# Runs INSIDE the test VM (tests/vm/vm.sh; a stock kernel with dm-crypt), as root. Checks, both ways, that data
# cryptblk writes reads back through kernel dm-crypt (cryptsetup open) and vice versa,
# for volumes formatted by either tool.
# usage: dmcrypt-interop.sh /path/to/cryptblk [section...]
#   (sections: luks plain families loopaes tcrypt tcrypt-system; tests/vm/run.sh spreads
#   them over guests that run at once)
set -uo pipefail
CB=$1; shift
SECTIONS=${*:-luks plain families loopaes tcrypt tcrypt-system}
want() { [[ " $SECTIONS " == *" $1 "* ]] && echo "== interop: $2 (at ${SECONDS}s)"; }
pass=0; fail=0
for s in $SECTIONS; do
  case $s in
    luks|plain|families|loopaes|tcrypt|tcrypt-system) ;;
    *) fail=$((fail+1)); echo "FAIL unknown section '$s'" ;;
  esac
done
modprobe loop 2>/dev/null
# The cipher families beyond AES (dm-crypt would request most of them itself).
for m in serpent_generic twofish_generic camellia_generic blowfish_generic cast5_generic des_generic lrw wp512 md5 crc32_generic essiv; do modprobe $m 2>/dev/null; done
cd /tmp
printf 'interop passphrase' > pw
check() { # name, command...
  local name=$1; shift
  if "$@"; then pass=$((pass+1)); echo "ok   $name"; else fail=$((fail+1)); echo "FAIL $name"; fi
}
SZ=1048576   # bytes of data checked per volume (2,048 512-byte sectors: emulated crypto is slow)
one() { # formatter type cipher keybits sector
  local fmt=$1 type=$2 cipher=$3 kb=$4 ss=$5 name="$1-made $2 $3/$4 sector $5"
  rm -f img; truncate -s 24M img
  local ssopt=(); [ "$type" = luks2 ] && ssopt=(--sector-size "$ss")
  if [ "$fmt" = cryptblk ]; then
    "$CB" format -q --type "$type" --cipher "$cipher" --key-size "$kb" "${ssopt[@]}" \
      --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw img || { fail=$((fail+1)); echo "FAIL $name: format"; return; }
  else
    cryptsetup luksFormat -q --type "$type" --cipher "$cipher" --key-size "$kb" "${ssopt[@]}" \
      --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw img || { fail=$((fail+1)); echo "FAIL $name: luksFormat"; return; }
  fi
  head -c $SZ /dev/urandom > a.bin; head -c $SZ /dev/urandom > b.bin
  "$CB" import --key-file pw img a.bin
  local L; L=$(losetup -f --show img)
  cryptsetup open --key-file pw "$L" t
  check "$name: cryptblk writes, dm-crypt reads" cmp -n $SZ /dev/mapper/t a.bin
  dd if=b.bin of=/dev/mapper/t bs=1M oflag=direct conv=fsync status=none
  cryptsetup close t; losetup -d "$L"
  "$CB" export --key-file pw --length $SZ img out.bin
  check "$name: dm-crypt writes, cryptblk reads" cmp out.bin b.bin
}
# Each volume formatted by one tool or the other, in turn: the kernel's data path is the
# point here (every process is slow in the emulator, ~6 s a volume); which tool reads
# which tool's header is checked on the host, against cryptsetup, for every combination
# (crates/format/tests: luks1_interop, luks2_interop).
turn=0
# one() with the formatter taking turns: cryptblk, then cryptsetup, then cryptblk...
one_alt() { turn=$((1 - turn)); local f=cryptsetup; [ $turn = 1 ] && f=cryptblk; one $f "$@"; }
if want luks "LUKS, AES"; then
  one_alt luks1 aes-xts-plain64 512 512
  one_alt luks1 aes-cbc-essiv:sha256 256 512
  one_alt luks1 aes-xts-plain64 256 512
  for ss in 512 4096; do
    one_alt luks2 aes-xts-plain64 512 $ss
    one_alt luks2 aes-xts-plain64 256 $ss
    one_alt luks2 aes-cbc-essiv:sha256 256 $ss
    one_alt luks2 aes-xts-plain 512 $ss
  done
fi
# Plain mode: passphrase hashing, offset, skip, and a raw key file.
plain() { # name, cryptsetup/cryptblk options...
  local name=$1; shift
  rm -f img; truncate -s 16M img; head -c $SZ /dev/urandom > a.bin
  "$CB" import --type plain "$@" img a.bin < pw
  local L; L=$(losetup -f --show img)
  cryptsetup open --type plain "$@" "$L" t < pw
  check "plain $name: cryptblk writes, dm-crypt reads" cmp -n $SZ /dev/mapper/t a.bin
  head -c $SZ /dev/urandom > b.bin
  dd if=b.bin of=/dev/mapper/t bs=1M oflag=direct conv=fsync status=none
  cryptsetup close t; losetup -d "$L"
  "$CB" export --type plain "$@" --length $SZ img out.bin < pw
  check "plain $name: dm-crypt writes, cryptblk reads" cmp out.bin b.bin
}
if want plain plain; then
plain "defaults"
plain "xts sha256 offset/skip" --cipher aes-xts-plain64 --key-size 512 --hash sha256 --offset 2048 --skip 77
# No --key-size: 256 bits whatever the cipher (AES-128-XTS here), as cryptsetup does.
plain "xts default key size" --cipher aes-xts-plain64 --hash sha256
plain "xts 4096 iv-large" --cipher aes-xts-plain64 --key-size 256 --hash sha512 --sector-size 4096 --iv-large-sectors
plain "cbc-plain64 4096" --cipher aes-cbc-plain64 --key-size 256 --hash sha256 --sector-size 4096
head -c 64 /dev/urandom > raw.key
plain "raw key file" --cipher aes-xts-plain64 --key-size 512 --key-file raw.key
fi
# Every other cipher family and IV generator the kernel has (Kuznyechik it has not),
# both ways: LUKS volumes either tool formats, and plain mappings with a raw key.
if want families "other cipher families"; then
  one_alt luks1 serpent-xts-plain64 512 512
  one_alt luks1 twofish-xts-plain64 256 512
  one_alt luks2 camellia-xts-plain64 512 4096
  one_alt luks2 serpent-cbc-essiv:sha256 256 512
  one_alt luks1 aes-lrw-benbi 384 512
  one_alt luks2 twofish-cbc-plain64 256 4096
  one_alt luks1 blowfish-cbc-essiv:sha256 256 512
  one_alt luks1 aes-xts-essiv:sha256 512 512
  one_alt luks2 serpent-xts-plain64 512 4096
  one_alt luks2 camellia-cbc-essiv:sha256 256 512
head -c 256 /dev/urandom > raw.key
plain "serpent-lrw-benbi" --cipher serpent-lrw-benbi --key-size 384 --key-file raw.key
plain "camellia-cbc-benbi" --cipher camellia-cbc-benbi --key-size 256 --key-file raw.key
plain "aes-cbc-tcw" --cipher aes-cbc-tcw --key-size 512 --key-file raw.key
plain "aes-cbc-lmk" --cipher aes-cbc-lmk --key-size 256 --key-file raw.key
plain "aes-cbc-eboiv 4096" --cipher aes-cbc-eboiv --key-size 256 --sector-size 4096 --iv-large-sectors --key-file raw.key
plain "cast5-cbc-plain64" --cipher cast5-cbc-plain64 --key-size 128 --key-file raw.key
plain "des3_ede-cbc-plain" --cipher des3_ede-cbc-plain --key-size 192 --key-file raw.key
fi
# loop-AES: key files of 1, 64 (v2) and 65 (v3) keys, cryptsetup's loopaesOpen beside.
loopaes() { # name, cryptsetup/cryptblk options...
  local name=$1; shift
  rm -f img; truncate -s 16M img; head -c $SZ /dev/urandom > a.bin
  "$CB" import --type loopaes "$@" img a.bin
  local L; L=$(losetup -f --show img)
  cryptsetup open --type loopaes "$@" "$L" t
  check "loop-AES $name: cryptblk writes, dm-crypt reads" cmp -n $SZ /dev/mapper/t a.bin
  head -c $SZ /dev/urandom > b.bin
  dd if=b.bin of=/dev/mapper/t bs=1M oflag=direct conv=fsync status=none
  cryptsetup close t; losetup -d "$L"
  "$CB" export --type loopaes "$@" --length $SZ img out.bin
  check "loop-AES $name: dm-crypt writes, cryptblk reads" cmp out.bin b.bin
}
if want loopaes loop-AES; then
for n in 1 64 65; do head -c 4000 /dev/urandom | base64 -w 32 | head -n $n > lk$n; done
loopaes "1 key" --key-file lk1
loopaes "64 keys (v2), 256-bit" --key-file lk64 --key-size 256
loopaes "65 keys (v3), offset" --key-file lk65 --offset 16
loopaes "65 keys, 192-bit, sha256, skip" --key-file lk65 --key-size 192 --hash sha256 --skip 3
loopaes "64 keys, serpent" --key-file lk64 --cipher serpent
fi
# TrueCrypt/VeraCrypt (cryptsetup's images): cryptblk writes, the kernel's TCRYPT mapping
# (cryptsetup tcryptOpen) reads, and the reverse; tcryptDump's text from both tools.
tcrypt() { # image, hash, password, extra options...
  local img=$1 h=$2 pw=$3; shift 3
  local name="tcrypt $img $*"
  echo "   (tcrypt $img at ${SECONDS}s)"
  cp "/results/tcrypt/$img" tc.img
  local len=4096
  head -c $len /dev/urandom > a.bin; head -c $len /dev/urandom > b.bin
  echo "$pw" | "$CB" import --type tcrypt -h "$h" "$@" tc.img a.bin
  local L; L=$(losetup -f --show tc.img)
  echo "$pw" | cryptsetup tcryptOpen -h "$h" "$@" "$L" t
  check "$name: cryptblk writes, dm-crypt reads" cmp -n $len /dev/mapper/t a.bin
  dd if=b.bin of=/dev/mapper/t bs=$len count=1 oflag=direct conv=fsync status=none
  echo "$pw" | cryptsetup tcryptDump -h "$h" "$@" "$L" | sed 1d > dump.cs
  cryptsetup close t; losetup -d "$L"
  echo "$pw" | "$CB" export --type tcrypt -h "$h" "$@" --length $len tc.img out.bin
  check "$name: dm-crypt writes, cryptblk reads" cmp out.bin b.bin
  echo "$pw" | "$CB" dump --type tcrypt -h "$h" "$@" tc.img | sed 1d > dump.cb
  check "$name: tcryptDump text" diff dump.cs dump.cb
}
if ! want tcrypt TrueCrypt/VeraCrypt; then
  :
elif [ -d /results/tcrypt ]; then
  # VeraCrypt's KDF (500,000 iterations) takes 30-50 s a derivation in the emulator, five
  # per image: the VeraCrypt header path through the kernel is the system partition's
  # below; VeraCrypt images are checked on the host against cryptsetup (tcrypt.rs).
  tcrypt tc_5-sha512-xts-aes-twofish-serpent sha512 aaaaaaaaaaaa
  tcrypt tc_2-ripemd160-lrw-aes ripemd160 aaaaaaaaaaaa
  tcrypt tc_1-sha1-cbc-cast5 sha1 aaaaaaaaaaaa
  tcrypt tc_5-sha512-xts-aes-hidden sha512 bbbbbbbbbbbb --tcrypt-hidden
else
  fail=$((fail+1)); echo "FAIL tcrypt: cryptsetup's images missing (scripts/fetch-cryptsetup-images.sh)"
fi
# --tcrypt-system on one partition (needs partition devices: this kernel has them, the
# host's may not): both tools read the header from the partition's disk and map the
# partition with IVs counted from the disk's start. cryptsetup's system image, its
# partition entry moved to where the encrypted area starts (sector 256). The hash is
# given: trying every KDF (VeraCrypt's 500,000 iterations each) took 7 minutes in the
# emulator; finding the hash is tested on the host (crates/cli/tests/formats/tcrypt.rs).
if ! want tcrypt-system "TrueCrypt system partition"; then
  :
elif [ -f /results/tcrypt/sys_vc_1-sha256-xts-aes ]; then
  cp /results/tcrypt/sys_vc_1-sha256-xts-aes sys.img
  python3 - sys.img <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
d = bytearray(f.read(512))
n = f.seek(0, 2) // 512
struct.pack_into("<II", d, 446 + 8, 256, n - 256)
f.seek(0)
f.write(d)
PY
  L=$(losetup -P -f --show sys.img)
  for _ in $(seq 50); do [ -b "${L}p1" ] && break; sleep 0.1; done
  pw=aaaaaaaaaaaa name="tcrypt --tcrypt-system on partition ${L}p1"
  echo $pw | "$CB" export --type tcrypt -h sha256 --tcrypt-system "${L}p1" out.bin
  echo $pw | cryptsetup tcryptOpen -h sha256 --tcrypt-system "${L}p1" t
  check "$name: cryptblk reads what dm-crypt reads" cmp out.bin /dev/mapper/t
  cryptsetup close t
  echo $pw | "$CB" export --type tcrypt -h sha256 --tcrypt-system sys.img whole.bin
  check "$name: the same bytes as the whole disk mapped" cmp out.bin whole.bin
  cp sys.img hdr.img
  echo $pw | "$CB" export --type tcrypt -h sha256 --tcrypt-system --header hdr.img "${L}p1" hdr.bin
  check "$name: the same with --header (the partition still sets the IVs)" cmp out.bin hdr.bin
  head -c 8192 /dev/urandom > a.bin
  echo $pw | "$CB" import --type tcrypt -h sha256 --tcrypt-system "${L}p1" a.bin
  echo $pw | cryptsetup tcryptOpen -h sha256 --tcrypt-system "${L}p1" t
  check "$name: cryptblk writes, dm-crypt reads" cmp -n 8192 /dev/mapper/t a.bin
  cryptsetup close t; losetup -d "$L"
else
  fail=$((fail+1)); echo "FAIL tcrypt system partition: cryptsetup's image missing"
fi
echo "dm-crypt interop: $pass passed, $fail failed (${SECONDS}s)"
[ "$fail" -eq 0 ]
