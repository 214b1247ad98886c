#!/usr/bin/env bash
# The vhost-user-blk frontend with a real VM: cryptblk serves volumes on the host, QEMU
# (tests/vm/vm.sh, CRYPTBLK_VM_VHOST_USER_BLK) gives them to the guest as virtio-blk disks
# over shared memory, and the guest's own kernel uses them. Three parts:
#
#   vhost-user-blk.sh host-start DIR BIN   (host) images, servers and a helper that kills,
#                                          restarts or closes a server when the guest asks;
#                                          prints the CRYPTBLK_VM_VHOST_USER_BLK value
#   vhost-user-blk.sh guest DIR            (guest, DIR = /results) the checks
#   vhost-user-blk.sh host-stop DIR BIN    (host) the helper and any server left stopped
#
# Disks, in order: vda LUKS2 (2 queues, discards allowed), vdb BitLocker (cryptsetup's
# bitlk-aes-xts-128 image), vdc VeraCrypt (vc_1-sha256-xts-aes), vdd LUKS2 read-only.
# The guest writes file systems and fio verify runs on them, checks the serial, queues,
# block size, discard, read-only; has the host kill -9 the LUKS2 server under fio and
# start a new one (QEMU reconnects; the guest sees no error, and data fsynced before the
# kill is there); then has the host close every server and opens the images themselves
# with cryptsetup (dm-crypt) to find the same data.
set -uo pipefail
mode=${1:?mode}
DIR=${2:?dir}
V=$DIR/vub

host_open() { # name image socket extra-args...; passphrase on stdin
  local name=$1 img=$2 sock=$3; shift 3
  "$BIN" open "$img" "$name" --vhost-user-blk "$sock" --daemon --run-dir "$V/run" "$@" > /dev/null
}

host_spec() { # the open arguments of each server, one line each: name image socket pw extra
  cat << EOF
luks2 $V/luks2.img $V/luks2.sock $V/pw --queues 2 --allow-discards --type luks2
bitlk $V/bitlk.img $V/bitlk.sock $V/bitlk.pw --queues 1 --type bitlk
vc $V/vc.img $V/vc.sock $V/vc.pw --queues 1 --type tcrypt --veracrypt
ro $V/ro.img $V/ro.sock $V/pw --queues 1 --readonly --type luks2
EOF
}

start_one() { # name
  local name img sock pw extra
  while read -r name img sock pw extra; do
    [ "$name" = "$1" ] || continue
    # shellcheck disable=SC2086
    host_open "$name" "$img" "$sock" $extra < "$pw"
    return
  done < <(host_spec)
  return 1
}

# Answers the guest's requests (files in $V/req): kill-NAME (kill -9, then a new server on
# the same socket), close-NAME; each answered by the same name in $V/ack.
helper() {
  while [ ! -e "$V/stop-helper" ]; do
    local r
    for r in "$V"/req/*; do
      [ -e "$r" ] || continue
      local what=${r##*/} name
      name=${what#*-}
      case $what in
        kill-*)
          kill -9 "$(cat "$V/run/$name.pid")"
          sleep 0.5
          if start_one "$name"; then echo ok > "$V/ack/$what"; else echo failed > "$V/ack/$what"; fi
          ;;
        close-*)
          # Closed, then read back by a new process: the plaintext of BitLocker and
          # VeraCrypt images for the guest to compare (it cannot afford their KDFs).
          local ok=ok
          "$BIN" close "$name" --run-dir "$V/run" || ok=failed
          case $name in
            bitlk) "$BIN" export --type bitlk "$V/bitlk.img" "$V/bitlk.plain" < "$V/bitlk.pw" || ok=failed ;;
            vc) "$BIN" export --type tcrypt --veracrypt "$V/vc.img" "$V/vc.plain" < "$V/vc.pw" || ok=failed ;;
          esac
          echo $ok > "$V/ack/$what"
          ;;
      esac
      rm -f "$r"
    done
    sleep 0.2
  done
}

case $mode in
  host-start)
    BIN=${3:?binary}
    rm -rf "$V"
    mkdir -p "$V/req" "$V/ack" "$V/run"
    chmod 0777 "$V/req" # the guest's root writes requests over 9p
    printf 'vhost passphrase' > "$V/pw"
    printf 'anaconda' > "$V/bitlk.pw"
    printf 'aaaaaaaaaaaa' > "$V/vc.pw"
    truncate -s 80M "$V/luks2.img"
    "$BIN" format -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$V/pw" "$V/luks2.img"
    "$BIN" dump "$V/luks2.img" | awk '/^UUID:/ {print $2}' > "$V/luks2.uuid"
    truncate -s 24M "$V/ro.img"
    "$BIN" format -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$V/pw" "$V/ro.img"
    imgs=target/cryptsetup-tests
    cp --sparse=always "$imgs/bitlk-images/bitlk-aes-xts-128.img" "$V/bitlk.img"
    cp "$imgs/tcrypt-images/vc_1-sha256-xts-aes" "$V/vc.img"
    while read -r name _; do start_one "$name" || { echo "vhost-user-blk: $name did not start" >&2; exit 1; }; done < <(host_spec)
    helper > "$V/helper.log" 2>&1 &
    echo $! > "$V/helper.pid"
    echo "$V/luks2.sock:2 $V/bitlk.sock:1 $V/vc.sock:1 $V/ro.sock:1"
    ;;
  host-stop)
    BIN=${3:?binary}
    touch "$V/stop-helper"
    [ -f "$V/helper.pid" ] && wait "$(cat "$V/helper.pid")" 2> /dev/null
    for n in luks2 bitlk vc ro; do "$BIN" close "$n" --run-dir "$V/run" > /dev/null 2>&1; done
    true
    ;;
  guest)
    fails=0
    check() { # description command...
      local what=$1; shift
      if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
    }
    ask() { # request: waits for the host's answer
      : > "$V/req/$1"
      for _ in $(seq 600); do
        if [ -f "$V/ack/$1" ]; then [ "$(cat "$V/ack/$1")" = ok ]; return; fi
        sleep 0.1
      done
      return 1
    }
    modprobe virtio_blk; modprobe loop
    echo "   (vhost-user-blk checks start at ${SECONDS}s)"
    for _ in $(seq 50); do [ -b /dev/vdd ] && break; sleep 0.1; done
    cd /tmp || exit 1
    # vda: LUKS2, two queues, discards allowed.
    check "vda's serial is the LUKS2 UUID (first 20 bytes)" \
      [ "$(cat /sys/block/vda/serial)" = "$(head -c 20 "$V/luks2.uuid")" ]
    check "vda has two queues" [ "$(ls /sys/block/vda/mq | wc -l)" -eq 2 ]
    check "vda's logical block size is the volume's sector size (4096)" \
      [ "$(cat /sys/block/vda/queue/logical_block_size)" -eq 4096 ]
    check "vda's size is the LUKS2 data area" [ "$(blockdev --getsize64 /dev/vda)" -eq $(((80 - 16) << 20)) ]
    check "vda has a write-back cache (flushes reach the volume)" grep -q "write back" /sys/block/vda/queue/write_cache
    mkfs.ext4 -q /dev/vda && mkdir -p /mnt/a && mount /dev/vda /mnt/a
    check "ext4 on vda mounts" mountpoint -q /mnt/a
    head -c 8M /dev/urandom > /mnt/a/before-kill && sync /mnt/a/before-kill
    sha256sum < /mnt/a/before-kill > before-kill.sha
    check "fstrim on vda discards (--allow-discards)" fstrim /mnt/a
    # The kernel log from here on only: this guest's earlier suites (ublk's kill -9 without
    # --recover) log I/O errors of their own on purpose.
    klog_from=$(dmesg | wc -l)
    # fio verify on both queues while the host kills the server (kill -9) and starts another:
    # QEMU reconnects and redoes what was in flight; the guest must see no error.
    # (6 s of writes whatever the speed, each block verified soon after it is written
    # (verify_backlog) and all again at the end: the kill at 2 s lands mid-run)
    fio --name=v --directory=/mnt/a --size=8M --time_based --runtime=6 --rw=randwrite \
      --bsrange=4k-64k --ioengine=libaio --iodepth=8 --numjobs=2 --direct=1 --verify=crc32c \
      --verify_backlog=64 --verify_fatal=1 --do_verify=1 --group_reporting > fio-kill.log 2>&1 &
    fio_pid=$!
    sleep 2
    check "the host killed vda's server (kill -9) and started a new one" ask kill-luks2
    check "fio was still running when the server was killed" kill -0 "$fio_pid"
    wait "$fio_pid"
    check "fio verify across the kill and reconnect" [ $? -eq 0 ]
    check "no I/O error in the guest's kernel log" sh -c "! dmesg | tail -n +$((klog_from + 1)) | grep -iE 'vda.*(error|fail)|I/O error'"
    echo 3 > /proc/sys/vm/drop_caches
    check "data fsynced before the kill is there after it" sh -c "sha256sum < /mnt/a/before-kill | cmp -s - before-kill.sha"
    umount /mnt/a
    # vdb: BitLocker.
    mkfs.ext4 -q /dev/vdb && mkdir -p /mnt/b && mount /dev/vdb /mnt/b
    check "ext4 on the BitLocker disk (vdb) mounts" mountpoint -q /mnt/b
    check "fio verify on the BitLocker disk's ext4" fio --name=b --directory=/mnt/b --size=4M \
      --rw=randwrite --bs=4k --ioengine=libaio --iodepth=8 --direct=1 --verify=crc32c \
      --verify_fatal=1 --output=fio-bitlk.log
    rm -f /mnt/b/b.*
    head -c 4M /dev/urandom > /mnt/b/f && umount /mnt/b
    dd if=/dev/vdb bs=1M count=8 iflag=direct status=none | sha256sum > bitlk-raw.sha
    # vdc: VeraCrypt (36 KiB, too small for ext4): fio verify, then raw data.
    check "fio verify on the VeraCrypt disk (raw)" fio --name=v --filename=/dev/vdc --size=32k \
      --rw=randwrite --bs=4k --ioengine=libaio --iodepth=8 --direct=1 --verify=crc32c \
      --verify_fatal=1 --output=fio-vc.log
    n=$(blockdev --getsize64 /dev/vdc)
    head -c "$n" /dev/urandom > vc.bin
    dd if=vc.bin of=/dev/vdc bs=4096 oflag=direct status=none
    check "VeraCrypt disk (vdc) reads back what was written" sh -c "dd if=/dev/vdc bs=4096 iflag=direct status=none | cmp -s - vc.bin"
    # vdd: read-only.
    check "the read-only disk (vdd) is read-only in the guest" [ "$(blockdev --getro /dev/vdd)" -eq 1 ]
    check "a read of vdd works" dd if=/dev/vdd of=/dev/null bs=1M count=4 iflag=direct status=none
    check "vdd has no discard" [ "$(cat /sys/block/vdd/queue/discard_max_bytes)" -eq 0 ]
    # The images themselves, after their servers close, in dm-crypt.
    for n in luks2 bitlk vc ro; do check "the host closed the $n server" ask "close-$n"; done
    L=$(losetup -f --show -r "$V/luks2.img")
    cryptsetup open --readonly --key-file "$V/pw" "$L" cs-luks2 && mkdir -p /mnt/c && mount -o ro /dev/mapper/cs-luks2 /mnt/c
    check "cryptsetup opens the LUKS2 image and mounts the guest's file system" mountpoint -q /mnt/c
    check "cryptsetup reads the file written before the kill" sh -c "sha256sum < /mnt/c/before-kill | cmp -s - before-kill.sha"
    check "fio's files are there" sh -c 'ls /mnt/c | grep -q "^v\."'
    umount /mnt/c; cryptsetup close cs-luks2; losetup -d "$L"
    # BitLocker and VeraCrypt in dm-crypt would cost minutes of emulated KDF here (cryptsetup
    # tries every VeraCrypt hash; BitLocker stretches 2^20 times): a fresh cryptblk on the
    # host exports their plaintext instead, when it closes them.
    check "the BitLocker image holds what the guest wrote" \
      sh -c "head -c 8M '$V/bitlk.plain' | sha256sum | cmp -s - bitlk-raw.sha"
    check "the VeraCrypt image holds what the guest wrote" cmp -s "$V/vc.plain" vc.bin
    echo "   (vhost-user-blk checks done at ${SECONDS}s)"
    if [ "$fails" -ne 0 ]; then
      echo "--- fio across the kill:"; tail -n 20 fio-kill.log
      dmesg | tail -n 20
      echo "vhost-user-blk: $fails FAILED"
      exit 1
    fi
    echo "vhost-user-blk: all checks passed"
    ;;
  *) echo "usage: $0 host-start|guest|host-stop DIR [BIN]" >&2; exit 2 ;;
esac
