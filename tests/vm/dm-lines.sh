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
echo "dm lines: $pass passed, $fail failed (at ${SECONDS}s)"
[ "$fail" -eq 0 ]
