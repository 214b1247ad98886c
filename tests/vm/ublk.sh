#!/usr/bin/env bash
# Runs INSIDE the test VM (tests/vm/vm.sh; a stock kernel with ublk_drv), as root. Checks `cryptblk open --ublk`:
# filesystems, fio with verification, dm-crypt interop through /dev/ublkbN, and a server
# killed with SIGKILL, with and without user recovery.
# usage: ublk.sh /path/to/cryptblk [section...]   (sections: features fs fio interop crash)
set -uo pipefail
CB=$1; shift
SECTIONS=${*:-features fs fio interop crash}
modprobe ublk_drv 2>/dev/null
modprobe loop 2>/dev/null
cd /tmp
printf 'ublk passphrase' > pw
RD=/tmp/rd
pass=0; fail=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then pass=$((pass+1)); echo "ok   $name"; else fail=$((fail+1)); echo "FAIL $name"; fi
}
want() { [[ " $SECTIONS " == *" $1 "* ]] && echo "== ublk: $1 (at ${SECONDS}s)"; }
quiet() { "$@" > /tmp/quiet.out 2>&1 || { tail -20 /tmp/quiet.out; false; }; }
KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)

# open IMG NAME [opts...]: serves IMG as ublk in the background, prints /dev/ublkbN.
open_ublk() {
  local img=$1 name=$2; shift 2
  "$CB" open "$img" "$name" --ublk --daemon --run-dir $RD "$@"
}
close_ublk() { "$CB" close "$1" --run-dir $RD; }
wait_gone() { # dev: wait until the block device node is gone
  for _ in $(seq 100); do [ -e "$1" ] || return 0; sleep 0.1; done; return 1
}

if [ ! -e /dev/ublk-control ]; then
  echo "FAIL ublk: /dev/ublk-control missing; cannot test the ublk frontend"
  exit 1
fi

# ---------------------------------------------------------------- features, status, close
if want features; then
  D=$(open_ublk mem:64M feat --queues 2 --queue-depth 16)
  check "open prints the device node ($D)" test -b "$D"
  "$CB" status feat --run-dir $RD > st.txt
  check "status shows the device path" grep -q "^$D is active" st.txt
  check "status shows frontend ublk" grep -q "frontend: ublk" st.txt
  "$CB" list --run-dir $RD --json > l.json
  echo "ublk features: $(python3 -c 'import json;v=json.load(open("l.json"))[0];print(" ".join(v["ublk_features"]), "recoverable=%s" % v["recoverable"])')"
  check "list shows frontend and path" python3 -c "
import json; v = json.load(open('l.json'))[0]
assert v['frontend'] == 'ublk' and v['path'] == '$D' and v['queues'] == 2 and v['queue_depth'] == 16, v
assert 'USER_RECOVERY' in v['ublk_features'] and v['recoverable'], v"
  B=$(basename "$D")
  check "logical block size = sector size (4096)" test "$(cat /sys/block/$B/queue/logical_block_size)" = 4096
  check "2 hardware queues" test "$(ls /sys/block/$B/mq | wc -l)" = 2
  check "write cache and FUA advertised" grep -q "write back" /sys/block/$B/queue/write_cache
  check "write-zeroes advertised" test "$(cat /sys/block/$B/queue/write_zeroes_max_bytes)" -gt 0
  check "discard off by default" test "$(cat /sys/block/$B/queue/discard_max_bytes)" = 0
  # Queue threads are pinned to their queue's CPUs.
  pid=$(cat $RD/feat.pid)
  aff=$(for t in /proc/$pid/task/*; do [[ $(cat $t/comm) == ublk*q* ]] && grep Cpus_allowed_list $t/status | awk '{print $2}'; done | sort | tr '\n' ' ')
  echo "queue thread CPUs: $aff"
  check "queue threads pinned (one CPU each)" test "$aff" = "0 1 "
  head -c 8M /dev/urandom > a.bin
  dd if=a.bin of="$D" bs=1M oflag=direct conv=nocreat status=none
  check "mem volume reads back" cmp -n 8388608 a.bin "$D"
  blkdiscard -z -o 0 -l 1048576 "$D"
  check "write-zeroes reads back as zeros" cmp -n 1048576 /dev/zero "$D"
  check "close" close_ublk feat
  check "close removed $D" wait_gone "$D"
  check "close removed the run-dir entry" test ! -e $RD/feat.ctl -a ! -e $RD/feat.ublk
  D=$(open_ublk mem:16M disc --allow-discards --queues 1)
  check "--allow-discards advertises discard" test "$(cat /sys/block/$(basename $D)/queue/discard_max_bytes)" -gt 0
  check "discard works" blkdiscard -o 0 -l 1048576 "$D"
  check "one queue when asked" test "$(ls /sys/block/$(basename $D)/mq | wc -l)" = 1
  close_ublk disc
fi

# ---------------------------------------------------------------- filesystems
fs_test() { # fs
  local fs=$1 img=/tmp/fs-$1.img
  rm -f $img; truncate -s 400M $img
  "$CB" format -q --type luks2 "${KDF[@]}" --key-file pw $img
  local D; D=$(open_ublk $img fs --key-file pw)
  if [ "$fs" = xfs ]; then mkfs.xfs -q "$D"; else mkfs.ext4 -q "$D"; fi
  rm -rf /mnt/u; mkdir -p /mnt/u && mount "$D" /mnt/u || { fail=$((fail+1)); echo "FAIL $fs: mount"; close_ublk fs; return; }
  cp -a /usr/include/linux /mnt/u/tree
  (cd /mnt/u && find tree -type f -print0 | sort -z | xargs -0 sha256sum) > sums-$fs
  umount /mnt/u
  check "$fs: close after unmount" close_ublk fs
  D=$(open_ublk $img fs --key-file pw)
  if [ "$fs" = xfs ]; then check "$fs: xfs_repair -n clean" quiet xfs_repair -n "$D"
  else check "$fs: e2fsck -fn clean" quiet e2fsck -fn "$D"; fi
  mount "$D" /mnt/u
  check "$fs: $(wc -l < sums-$fs) files match after reopen" bash -c "mountpoint -q /mnt/u && cd /mnt/u && sha256sum --quiet -c /tmp/sums-$fs"
  umount /mnt/u
  close_ublk fs
  rm -f $img
}
if want fs; then fs_test ext4; fs_test xfs; fi

# ---------------------------------------------------------------- fio with verification
if want fio; then
  img=/tmp/fio.img; rm -f $img; truncate -s 96M $img
  "$CB" format -q --type luks2 --sector-size 4096 "${KDF[@]}" --key-file pw $img
  D=$(open_ublk $img fio --key-file pw)
  fio_run() { fio "$@" || { tail -20 /tmp/fio.out; false; }; }
  fio_ok() { # name, fio options...
    local name=$1; shift
    check "fio $name" fio_run --name=v --filename="$D" --direct=1 --verify=crc32c --do_verify=1 \
      --verify_fatal=1 --size=8M --group_reporting --output=/tmp/fio.out "$@"
  }
  fio_ok "psync 4k randwrite, 2 jobs" --ioengine=psync --rw=randwrite --bs=4k --numjobs=2 --offset_increment=16M
  fio_ok "psync 1M write" --ioengine=psync --rw=write --bs=1M
  fio_ok "io_uring QD1 16k randwrite" --ioengine=io_uring --iodepth=1 --rw=randwrite --bs=16k
  fio_ok "io_uring QD32 4k-64k randwrite, 2 jobs" --ioengine=io_uring --iodepth=32 --rw=randwrite \
    --bsrange=4k-64k --numjobs=2 --offset_increment=16M
  fio_ok "io_uring QD128 4k randwrite" --ioengine=io_uring --iodepth=128 --rw=randwrite --bs=4k
  fio_ok "libaio QD64 1M write, 3 jobs" --ioengine=libaio --iodepth=64 --rw=write --bs=1M \
    --numjobs=3 --offset_increment=16M
  fio_ok "libaio QD16 128k randrw" --ioengine=libaio --iodepth=16 --rw=randrw --bs=128k
  check "fio: no request errors" python3 -c "
import json,subprocess; v=json.loads(subprocess.check_output(['$CB','list','--json','--run-dir','$RD']))[0]
print('  requests', v['requests'], 'errors', v['errors'], 'crypto calls', v['crypto_calls'])
assert v['errors'] == 0 and v['requests'] > 0"
  close_ublk fio
  rm -f $img
fi

# ---------------------------------------------------------------- dm-crypt interop
# Whole-device sha256 of what one side wrote must equal what the other side reads.
SZ=1M
interop() { # name, format command (on $img), open options for both tools...
  local name=$1 fmtcmd=$2; shift 2
  local img=/tmp/io.img; rm -f $img; truncate -s 20M $img
  eval "$fmtcmd" || { fail=$((fail+1)); echo "FAIL $name: format"; return; }
  local D; D=$(open_ublk $img io "$@" < pw) || { fail=$((fail+1)); echo "FAIL $name: open"; return; }
  head -c $SZ /dev/urandom | dd of="$D" bs=1M oflag=direct iflag=fullblock conv=nocreat status=none
  local a; a=$(sha256sum < "$D")
  close_ublk io
  local L; L=$(losetup -f --show $img)
  cryptsetup open "$@" "$L" t < pw
  local b; b=$(sha256sum < /dev/mapper/t)
  check "$name: cryptblk(ublk) writes, dm-crypt reads (sha256 of the device)" test "$a" = "$b"
  head -c $SZ /dev/urandom | dd of=/dev/mapper/t bs=1M oflag=direct iflag=fullblock status=none
  a=$(sha256sum < /dev/mapper/t)
  cryptsetup close t; losetup -d "$L"
  D=$(open_ublk $img io "$@" < pw)
  b=$(sha256sum < "$D")
  close_ublk io
  check "$name: dm-crypt writes, cryptblk(ublk) reads (sha256 of the device)" test "$a" = "$b"
}
if want interop; then
  # Every type, cipher and sector size, each volume formatted by one tool or the other (the
  # full cross product is in dmcrypt-interop.sh; here the point is the ublk data path).
  luks() { # type cipher keybits sector formatter
    local ssopt=""; [ $1 = luks2 ] && ssopt="--sector-size $4"
    local fmt="'$CB' format"; [ $5 = cryptsetup ] && fmt="cryptsetup luksFormat"
    interop "$1 $2 sector $4 (made by $5)" \
      "$fmt -q --type $1 --cipher $2 --key-size $3 $ssopt ${KDF[*]} --key-file pw \$img" --key-file pw
  }
  luks luks1 aes-xts-plain64 512 512 cryptblk
  luks luks1 aes-cbc-essiv:sha256 256 512 cryptsetup
  luks luks2 aes-xts-plain64 512 512 cryptsetup
  luks luks2 aes-xts-plain64 512 4096 cryptblk
  luks luks2 aes-cbc-essiv:sha256 256 4096 cryptsetup
  luks luks2 aes-cbc-essiv:sha256 256 512 cryptblk
  interop "plain aes-xts-plain64 sector 4096" true --type plain --cipher aes-xts-plain64 \
    --key-size 512 --hash sha256 --sector-size 4096
  interop "plain aes-cbc-essiv:sha256 sector 512" true --type plain \
    --cipher aes-cbc-essiv:sha256 --key-size 256 --hash sha256
fi

# ---------------------------------------------------------------- kill -9 of the server
if want crash; then
  # With user recovery: the kernel holds the I/O; a new server re-attaches and re-serves it.
  img=/tmp/crash.img; rm -f $img; truncate -s 128M $img
  "$CB" format -q --type luks2 "${KDF[@]}" --key-file pw $img
  D=$(open_ublk $img cr --key-file pw)
  mkfs.ext4 -q "$D"; rm -rf /mnt/u; mkdir -p /mnt/u
  check "recovery: mount" mount "$D" /mnt/u
  (for i in $(seq 1 4); do cp -a /usr/include/linux /mnt/u/t$i && sync || exit 1; done) &
  load=$!
  for _ in $(seq 600); do [ -e /mnt/u/t2 ] && break; sleep 0.1; done
  check "recovery: the write load is running when the server is killed" kill -0 $load
  kill -9 "$(cat $RD/cr.pid)"
  sleep 1
  check "recovery: device node kept while the server is dead" test -b "$D"
  "$CB" status cr --run-dir $RD > st.out 2>&1; rc=$?
  cat st.out
  check "recovery: status (exit $rc) says the device waits for --recover" \
    bash -c "test $rc -eq 4 && grep -q -- --recover st.out"
  # Another volume of the same size must never take the held writes (they would land
  # under the wrong key): refused, and the device stays held for the right one.
  other=/tmp/other.img; rm -f $other; truncate -s 128M $other
  echo "another passphrase" > pw2
  "$CB" format -q --type luks2 "${KDF[@]}" --key-file pw2 $other
  check "recovery: another volume is refused" \
    bash -c "! '$CB' open $other cr --ublk --recover --run-dir $RD --key-file pw2 2> rec.err && grep -q 'refusing to re-attach' rec.err"
  check "recovery: device still held after the refusal" test -b "$D"
  D2=$(open_ublk $img cr --key-file pw --recover)
  check "recovery: re-attached to the same device ($D2)" test "$D2" = "$D"
  check "recovery: the write load completed without errors" wait $load
  umount /mnt/u
  check "recovery: e2fsck -fn clean" quiet e2fsck -fn "$D"
  mount "$D" /mnt/u
  (cd /usr/include/linux && find . -type f -print0 | sort -z | xargs -0 sha256sum) > sums-src
  check "recovery: every copy matches" bash -c 'mountpoint -q /mnt/u && for i in $(seq 1 4); do (cd /mnt/u/t$i && sha256sum --quiet -c /tmp/sums-src) || exit 1; done'
  umount /mnt/u
  check "recovery: close" close_ublk cr

  # Without recovery: the device errors out; what was flushed before the crash survives.
  D=$(open_ublk $img nr --key-file pw --no-recovery)
  head -c 16M /dev/urandom > flushed.bin
  dd if=flushed.bin of="$D" bs=1M conv=fsync,nocreat status=none
  (while :; do dd if=/dev/urandom of="$D" bs=1M seek=32 count=64 oflag=direct conv=nocreat status=none || exit 1; done) 2>/dev/null &
  load=$!
  sleep 3
  kill -9 "$(cat $RD/nr.pid)"
  wait $load; rc=$?
  check "no recovery: the write load fails (rc $rc)" test $rc -ne 0
  check "no recovery: the device goes away" wait_gone "$D"
  check "no recovery: reading fails" bash -c "! dd if=$D of=/dev/null bs=4k count=1 status=none 2>/dev/null"
  check "no recovery: close removes the dead device" close_ublk nr
  D=$(open_ublk $img nr --key-file pw)
  check "no recovery: data flushed before the crash is intact" cmp -n 16777216 flushed.bin "$D"
  close_ublk nr
  rm -f $img
fi

if [ "$fail" -ne 0 ]; then
  for l in $RD/*.log; do [ -s "$l" ] && { echo "--- $l"; tail -n 20 "$l"; }; done
fi
echo "ublk: $pass passed, $fail failed (${SECONDS}s)"
[ "$fail" -eq 0 ]
