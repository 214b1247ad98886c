#!/usr/bin/env bash
# Runs INSIDE the test VM (tests/vm/vm.sh), as root. The lines of cryptsetup's compat-test
# and compat-test2 that need a block device for a mapping (tests/cryptsetup-suite/
# dm-lines.txt lists them as not runnable on the host), re-expressed here with cryptblk as
# `cryptsetup` (its drop-in): each volume is served over ublk and /dev/mapper/NAME is
# linked to its /dev/ublkbN, where device-mapper would have put the mapping. The scripts'
# own expectations: the compat image's plaintext checksum, LUKS1/LUKS2/plain volumes
# stacked on a served volume, a volume another is stacked on refused to close.
# usage: dm-lines.sh /path/to/cryptblk /path/to/compatimage.img.xz
set -uo pipefail
CB=$1
COMPAT=$2
modprobe ublk_drv 2>/dev/null
modprobe loop 2>/dev/null
work=$(mktemp -d /tmp/dm-lines.XXXXXX)
cd "$work"
mkdir bin
ln -s "$CB" bin/cryptsetup
CS=$PWD/bin/cryptsetup
export XDG_RUNTIME_DIR=$work/run
mkdir -m 700 run
mkdir -p /dev/mapper
pass=0; fail=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then pass=$((pass+1)); echo "ok   $name"; else fail=$((fail+1)); echo "FAIL $name"; fi
}
FAST=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
# map NAME PASSPHRASE ARGS...: `cryptsetup ARGS` (an open) served over ublk, the
# passphrase on stdin; /dev/mapper/NAME linked to the device it prints.
map() {
  local name=$1 pw=$2 node; shift 2
  printf '%s\n' "$pw" | "$CS" "$@" --ublk > "map-$name.out" 2>&1 || { cat "map-$name.out"; return 1; }
  # `status`'s first line names the device it is served as ("/dev/ublkbN is active.").
  node=$("$CS" status "$name" | head -n1 | cut -d' ' -f1)
  case $node in /dev/ublkb*) ;; *) echo "served as '$node', not a ublk device"; return 1 ;; esac
  ln -sfn "$node" "/dev/mapper/$name" && [ -b "/dev/mapper/$name" ]
}
unmap() { timeout 60 "$CS" close "$1" && rm -f "/dev/mapper/$1"; }
# What a failed section left open goes before the next one starts.
tidy() { for n in dmvol2 dmvol; do timeout 60 "$CS" close "$n" > /dev/null 2>&1; rm -f "/dev/mapper/$n"; done; }

echo "== dm lines: compat-test [1] the compat image through /dev/mapper (at ${SECONDS}s)"
if [ -f "$COMPAT" ]; then
  xz -cd "$COMPAT" > compat.img
  L=$(losetup -f --show compat.img)
  check "compat-test:311 luksOpen the compat image" map dmvol compatkey luksOpen "$L" dmvol
  check "compat-test:314 its plaintext's sha256 is the script's" bash -c \
    "[ \"\$(sha256sum -b /dev/mapper/dmvol | cut -f1 -d' ')\" = 7428e8f2436882a07eb32765086f5c899474c08b5576f556b573d2aabdf923e8 ]"
  check "compat-test:315 luksClose" unmap dmvol
  tidy; losetup -d "$L"
else
  fail=$((fail+1))
  echo "FAIL compat-test:311-315: no $COMPAT (scripts/fetch-cryptsetup-images.sh puts it in target/cryptsetup-src/tests)"
fi

for v in 1 2; do
  t=compat-test; [ $v = 2 ] && t=compat-test2
  echo "== dm lines: $t, LUKS$v stacked on a served volume (at ${SECONDS}s)"
  truncate -s 64M stack.img
  L=$(losetup -f --show stack.img)
  printf 'pw1\n' | "$CS" -q luksFormat --type luks$v "${FAST[@]}" "$L"
  check "$t: luksOpen the lower volume" map dmvol pw1 -q luksOpen "$L" dmvol
  check "$t: luksFormat --type luks$v /dev/mapper/dmvol" \
    bash -c "printf 'pw1\n' | '$CS' -q luksFormat --type luks$v ${FAST[*]} /dev/mapper/dmvol"
  check "$t: luksOpen /dev/mapper/dmvol dmvol2 (stacked)" map dmvol2 pw1 -q luksOpen /dev/mapper/dmvol dmvol2
  check "$t: data through both layers" bash -c \
    "[ -b /dev/mapper/dmvol2 ] && head -c 1M /dev/urandom > d && dd if=d of=/dev/mapper/dmvol2 bs=1M oflag=direct status=none && cmp -n 1048576 d /dev/mapper/dmvol2"
  check "$t: luksClose the upper" unmap dmvol2
  check "$t: luksClose the lower" unmap dmvol
  tidy; losetup -d "$L"
done

echo "== dm lines: compat-test [31] plain stacked: the lower one is busy (at ${SECONDS}s)"
truncate -s 16M plain.img
L=$(losetup -f --show plain.img)
check "compat-test:839 plain open" map dmvol pw1 open --type plain --hash sha256 "$L" dmvol
check "compat-test:840 plain open on /dev/mapper/dmvol" \
  map dmvol2 pw2 open --type plain --hash sha256 /dev/mapper/dmvol dmvol2
check "compat-test:841 close of the volume another is stacked on refused" \
  bash -c "! timeout 60 '$CS' close dmvol > /dev/null 2>&1"
check "compat-test:842 ... and it is still active" bash -c "'$CS' -q status dmvol > /dev/null 2>&1"
check "compat-test:850 close the upper" unmap dmvol2
check "compat-test:850 then the lower" unmap dmvol
check "compat-test:851 inactive after" bash -c "! '$CS' -q status dmvol > /dev/null 2>&1"
losetup -d "$L"

PWD1=93R4P4pIqAH8
fresh() { # a wiped 40 MiB image on a loop device, in $L
  [ -n "${L:-}" ] && losetup -d "$L" 2>/dev/null
  rm -f img; truncate -s 40M img
  L=$(losetup -f --show img)
}
for v in 1 2; do
  t=compat-test; [ $v = 2 ] && t=compat-test2
  echo "== dm lines: $t [22] the device under a volume disappears (dmsetup linear, then error) (at ${SECONDS}s)"
  fresh
  check "$t: dmsetup create a linear device on the loop device" dmsetup create dmlin --table "0 39998 linear $L 2"
  check "$t: luksFormat /dev/mapper/dmlin" bash -c "echo $PWD1 | '$CS' -q ${FAST[*]} luksFormat --type luks$v /dev/mapper/dmlin"
  check "$t: luksOpen /dev/mapper/dmlin dmvol2" map dmvol2 "$PWD1" -q luksOpen /dev/mapper/dmlin dmvol2
  check "$t: the device under it now fails every I/O (dmsetup load error, resume)" \
    bash -c "dmsetup load dmlin --table '0 40000 error' && dmsetup resume dmlin"
  check "$t: luksClose the volume all the same" unmap dmvol2
  check "$t: dmsetup remove the device under it (nothing holds it)" dmsetup remove --retry dmlin
  tidy; dmsetup remove dmlin 2>/dev/null
done

echo "== dm lines: compat-test [26] a key file at a 5 GB offset of a large device (at ${SECONDS}s)"
fresh
printf 'x%.0s' $(seq 32) > key2
printf '%s' "$PWD1" > key1
check "compat-test:701 a 5.6 GB dm device (error, then zero)" \
  bash -c "printf '0 10000000 error\n10000000 1000000 zero\n' | dmsetup create dmbig"
check "compat-test:702 luksFormat with the key at offset 5120000000 of it, 13 bytes" \
  "$CS" -q luksFormat --type luks1 "${FAST[@]}" "$L" /dev/mapper/dmbig -l 13 --keyfile-offset 5120000000
check "compat-test:703 one byte before it: refused" \
  bash -c "! '$CS' --key-file=/dev/mapper/dmbig -l 13 --keyfile-offset 5119999999 luksOpen --test-passphrase '$L' 2>/dev/null"
check "compat-test:704 at the offset: luksOpen" map dmvol "" --key-file=/dev/mapper/dmbig -l 13 --keyfile-offset 5120000000 luksOpen "$L" dmvol
check "compat-test:705 luksClose" unmap dmvol
check "compat-test:706 luksChangeKey to another offset and size of it" \
  "$CS" luksChangeKey "$L" "${FAST[@]}" -d /dev/mapper/dmbig --keyfile-offset 5120000000 -l 13 /dev/mapper/dmbig --new-keyfile-offset 5120000001 --new-keyfile-size 15
check "compat-test:707 ... which opens it" \
  "$CS" --key-file=/dev/mapper/dmbig -l 15 --keyfile-offset 5120000001 luksOpen --test-passphrase "$L"
tidy; dmsetup remove --retry dmbig

echo "== dm lines: a disk with 4096-byte logical sectors (scsi_debug) (at ${SECONDS}s)"
modprobe sd_mod 2>/dev/null  # the disk driver: without it scsi_debug makes no /dev/sdX
if modprobe scsi_debug dev_size_mb=32 sector_size=4096 2>/dev/null; then
  # Found as cryptsetup's scripts find it: the disk whose model is scsi_debug.
  SD=
  for _ in $(seq 200); do
    SD=$(grep -l -e scsi_debug /sys/block/*/device/model 2>/dev/null | cut -f4 -d / | head -n1)
    [ -n "$SD" ] && [ -b "/dev/$SD" ] && break
    sleep 0.1
  done
  SD=/dev/$SD
  check "compat-test:583 plain create on it" map dmvol "$PWD1" create dmvol --hash sha256 "$SD"
  old=$("$CS" status dmvol | sed -n 's/^ *size: *\([0-9]*\) .*/\1/p')
  check "compat-test:585 resize to 7 sectors (not a whole 4096-byte block): refused" \
    bash -c "! '$CS' resize dmvol -b 7 2>/dev/null"
  check "compat-test:587 ... the size unchanged" \
    bash -c "[ -n '$old' ] && [ \"\$('$CS' status dmvol | sed -n 's/^ *size: *\([0-9]*\) .*/\1/p')\" = '$old' ]"
  check "compat-test:589 close" unmap dmvol
  check "compat-test:591 plain create of 7 sectors on it: refused" \
    bash -c "! printf '%s\n' $PWD1 | '$CS' create dmvol --hash sha256 '$SD' -b 7 2>/dev/null"
  check "compat-test:592 ... and nothing is active" bash -c "! '$CS' status dmvol > /dev/null 2>&1"
  check "compat-test2:562 luksFormat on it" bash -c "echo $PWD1 | '$CS' luksFormat -q --type luks2 ${FAST[*]} '$SD'"
  check "compat-test2:563 open" map dmvol "$PWD1" open "$SD" dmvol
  check "compat-test2:565 resize -b 7: refused" bash -c "! echo $PWD1 | '$CS' resize dmvol -b 7 2>/dev/null"
  check "compat-test2:569 close" unmap dmvol
  tidy
  rmmod scsi_debug 2>/dev/null
else
  fail=$((fail+1)); echo "FAIL scsi_debug: the guest kernel cannot make a 4096-byte-sector disk (modprobe scsi_debug)"
fi

echo "== dm lines: compat-test [29] repair, on a loop device (dd keeps its size) (at ${SECONDS}s)"
fresh
check "compat-test:810 luksFormat" "$CS" -q luksFormat --type luks1 "${FAST[@]}" "$L" key1 --key-slot 0
dd if=/dev/urandom of="$L" bs=512 seek=1 count=1 status=none
check "compat-test:813 a damaged keyslot area: open refused" bash -c "! '$CS' luksOpen --test-passphrase -d key1 '$L' > /dev/null 2>&1"
check "compat-test:814 repair" "$CS" -q repair "$L"
check "compat-test:815 opens after repair" "$CS" luksOpen --test-passphrase -d key1 "$L"
check "compat-test:818 luksFormat aes-ecb" "$CS" -q luksFormat --type luks1 "${FAST[@]}" "$L" key1 --hash sha256 -c aes-ecb
printf 'ecb-xxx' | dd of="$L" bs=1 seek=40 status=none
check "compat-test:820 repair of the mode 'ecb-xxx'" "$CS" -q repair "$L"
check "compat-test:821 opens after repair" "$CS" luksOpen --test-passphrase -d key1 "$L"
printf 'SHA256' | dd of="$L" bs=1 seek=72 status=none
check "compat-test:825 repair of an uppercase hash" "$CS" -q repair "$L"
check "compat-test:826 opens after repair" "$CS" luksOpen --test-passphrase -d key1 "$L"

echo "== dm lines: compat-test2 [19] resize, on a loop device (512-byte sectors) (at ${SECONDS}s)"
fresh
check "compat-test2:520 luksFormat" bash -c "echo $PWD1 | '$CS' luksFormat ${FAST[*]} --type luks2 '$L'"
check "compat-test2:521 open (served over NBD, which can change size)" bash -c "echo $PWD1 | '$CS' luksOpen '$L' dmvol"
size() { "$CS" -q status dmvol | grep "size:" | grep -q "$1 sectors"; }
check "compat-test2:531 resize --size 100" bash -c "echo $PWD1 | '$CS' -q resize --size 100 dmvol"
check "compat-test2:532 ... 100 sectors" size 100
check "compat-test2:533 resize --device-size 51200" bash -c "echo $PWD1 | '$CS' -q resize --device-size 51200 dmvol"
check "compat-test2:534 ... 100 sectors" size 100
check "compat-test2:535 resize --device-size 1M" bash -c "echo $PWD1 | '$CS' -q resize --device-size 1M dmvol"
check "compat-test2:536 ... 2048 sectors" size 2048
check "compat-test2:537 --device-size with --size: refused" bash -c "! echo $PWD1 | '$CS' -q resize --device-size 512k --size 1024 dmvol > /dev/null 2>&1"
check "compat-test2:538 --device-size 4097 (not whole sectors): refused" bash -c "! echo $PWD1 | '$CS' -q resize --device-size 4097 dmvol > /dev/null 2>&1"
check "compat-test2:539 ... 2048 sectors" size 2048
check "compat-test2:540 close" "$CS" close dmvol
check "compat-test2:541 open again" bash -c "echo $PWD1 | '$CS' luksOpen --disable-keyring '$L' dmvol"
check "compat-test2:542 resize --size 100 (the key from the server, none typed)" bash -c "echo | '$CS' -q resize --size 100 dmvol"
check "compat-test2:543 ... 100 sectors" size 100
check "compat-test2:544 close" "$CS" close dmvol

echo "== dm lines: compat-test2 [39] LUKS2 to LUKS1 and back on a loop device (512-byte sectors) (at ${SECONDS}s)"
fresh
PWD2=mymJeD8ivEhE
check "compat-test2:817 luksFormat, key slot 0" bash -c "echo $PWD1 | '$CS' -q luksFormat ${FAST[*]} --type luks2 --key-slot 0 '$L'"
check "compat-test2:818 luksAddKey, key slot 1" bash -c "printf '%s\n%s\n' $PWD1 $PWD2 | '$CS' -q luksAddKey ${FAST[*]} --key-slot 1 '$L'"
check "compat-test2:819 luksChangeKey (slot 0's area now after slot 1's)" bash -c "printf '%s\n%s\n' $PWD1 $PWD1 | '$CS' -q luksChangeKey ${FAST[*]} '$L'"
check "compat-test2:821 convert to LUKS1 (512-byte sectors allow it)" "$CS" -q convert --type luks1 "$L"
check "compat-test2:822 the first passphrase opens it" bash -c "echo $PWD1 | '$CS' -q open --test-passphrase '$L'"
check "compat-test2:823 the second too" bash -c "echo $PWD2 | '$CS' -q open --test-passphrase '$L'"
check "compat-test2:824 convert back to LUKS2" "$CS" -q convert --type luks2 "$L"
check "compat-test2:825 the first passphrase opens it" bash -c "echo $PWD1 | '$CS' -q open --test-passphrase '$L'"
check "compat-test2:826 the second too" bash -c "echo $PWD2 | '$CS' -q open --test-passphrase '$L'"

echo "== dm lines: compat-test2 [40] a keyslots area the loop device cannot hold (at ${SECONDS}s)"
fresh
check "compat-test2:1076 128 MiB of keyslots on a 40 MiB loop device: refused" \
  bash -c "! echo $PWD1 | '$CS' -q luksFormat ${FAST[*]} --type luks2 '$L' --key-size 256 --luks2-metadata-size=128k --luks2-keyslots-size=128M > /dev/null 2>&1"
losetup -d "$L"
echo "dm lines: $pass passed, $fail failed (at ${SECONDS}s)"
[ "$fail" -eq 0 ]
