#!/bin/bash
# A/B of two cryptblk builds over FUSE (a RAM volume, aes-xts-plain64, 4096-byte sectors):
# 1 MiB O_DIRECT writes and reads, and 6 KiB random read/write on a 512-byte grid (every
# request a read-modify-write). Alternating builds, 3 rounds, MB/s; prints the medians and
# new/old. Needs root (FUSE), fio. usage: scripts/bench-ab-fuse.sh OLD_BIN NEW_BIN
set -u
OLD=${1:?usage: scripts/bench-ab-fuse.sh OLD_CRYPTBLK NEW_CRYPTBLK} NEW=${2:?usage: scripts/bench-ab-fuse.sh OLD_CRYPTBLK NEW_CRYPTBLK}
D=$(mktemp -d /dev/shm/cryptblk-ab.XXXXXX) # 0700, ours
trap 'rm -rf "$D"' EXIT
mkdir $D/mnt; (umask 077; head -c 64 /dev/urandom > $D/key)
fio_mbps() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print("%.0f"%((j["read"]["bw"]+j["write"]["bw"])/1024))'; }
run() { # bin case
  local b=$1 c=$2
  case $c in
    fuse-write-1m|fuse-read-1m)
      $b open mem:1G v --fuse $D/mnt --run-dir $D/run --daemon --key-file $D/key >/dev/null || return
      rw=write; [ $c = fuse-read-1m ] && rw=read
      fio --name=x --filename=$D/mnt/v --rw=$rw --bs=1M --direct=1 --ioengine=psync --size=1G --time_based --runtime=4 --output-format=json 2>/dev/null | fio_mbps
      $b close v --run-dir $D/run ;;
    fuse-unaligned-6k)
      $b open mem:1G v --fuse $D/mnt --run-dir $D/run --daemon --key-file $D/key >/dev/null || return
      fio --name=x --filename=$D/mnt/v --rw=randrw --bs=6k --blockalign=512 --direct=1 --ioengine=psync --numjobs=2 --group_reporting --size=1G --time_based --runtime=4 --output-format=json 2>/dev/null | fio_mbps
      $b close v --run-dir $D/run ;;
  esac
}
for c in ${CASES:-fuse-write-1m fuse-read-1m fuse-unaligned-6k}; do
  o=(); n=()
  for r in 1 2 3; do o+=($(run $OLD $c)); n+=($(run $NEW $c)); done
  mo=$(printf '%s\n' "${o[@]}" | sort -n | sed -n 2p); mn=$(printf '%s\n' "${n[@]}" | sort -n | sed -n 2p)
  echo "$c old ${o[*]} new ${n[*]} median old $mo new $mn ratio $(python3 -c "print('%.2f'%($mn/$mo))")"
done
