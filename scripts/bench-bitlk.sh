#!/bin/bash
# BitLocker over FUSE: cryptblk's FUSE file beside dislocker's (dislocker-fuse), the same
# image of cryptsetup's test set, in one run: 1 MiB sequential reads and 4 KiB random
# reads (one job, four jobs, and one job at queue depth 16 through libaio), O_DIRECT, psync
# unless said, 5 s each, 3 alternating rounds, median MB/s and the ratio.
# Needs root (FUSE), fio, dislocker; the images from scripts/fetch-cryptsetup-images.sh.
# usage: scripts/bench-bitlk.sh [IMAGE-NAME...]  (default: aes-xts-128, aes-cbc-elephant-128)
set -u
B=${CRYPTBLK:-$PWD/target/release/cryptblk}
SRC=${SRC:-$PWD/target/cryptsetup-tests/bitlk-images}
D=$(mktemp -d /dev/shm/cryptblk-bitlk.XXXXXX) # 0700, ours
cleanup() { fusermount3 -u $D/dl 2>/dev/null || fusermount -u $D/dl 2>/dev/null; $B close v --run-dir $D/run >/dev/null 2>&1; rm -rf "$D"; }
trap cleanup EXIT
mkdir $D/dl $D/cb
fio_mbps() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print("%.0f"%(j["read"]["bw"]/1024))'; }
job() { # file workload
  case $2 in
    seq-1m) fio --name=x --filename=$1 --rw=read --bs=1M --direct=1 --ioengine=psync --time_based --runtime=5 --output-format=json 2>/dev/null | fio_mbps ;;
    rand-4k) fio --name=x --filename=$1 --rw=randread --bs=4k --direct=1 --ioengine=psync --time_based --runtime=5 --output-format=json 2>/dev/null | fio_mbps ;;
    rand-4k-qd16) fio --name=x --filename=$1 --rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=16 --time_based --runtime=5 --output-format=json 2>/dev/null | fio_mbps ;;
    rand-4k-4jobs) fio --name=x --filename=$1 --rw=randread --bs=4k --direct=1 --ioengine=psync --numjobs=4 --group_reporting --time_based --runtime=5 --output-format=json 2>/dev/null | fio_mbps ;;
  esac
}
run() { # tool image workload
  case $1 in
    dislocker)
      dislocker-fuse -V $3 -uanaconda -- $D/dl >/dev/null || return
      job $D/dl/dislocker-file $4
      fusermount3 -u $D/dl 2>/dev/null || fusermount -u $D/dl ;;
    cryptblk)
      echo anaconda | $B open --type bitlk -r $3 v --fuse $D/cb --run-dir $D/run --daemon >/dev/null || return
      job $D/cb/v $4
      $B close v --run-dir $D/run >/dev/null ;;
  esac
}
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; $(dislocker-fuse -h 2>&1 | grep -m1 -o 'dislocker[^ ]* [0-9.]*' || echo dislocker)"
echo "| image | workload | dislocker-fuse MB/s | cryptblk FUSE MB/s | cryptblk ÷ dislocker |"
echo "|---|---|---|---|---|"
for name in ${@:-bitlk-aes-xts-128 bitlk-aes-cbc-elephant-128}; do
  cp $SRC/$name.img $D/img
  for w in ${WORKLOADS:-seq-1m rand-4k rand-4k-4jobs rand-4k-qd16}; do
    a=(); c=()
    for r in 1 2 3; do a+=($(run dislocker x $D/img $w)); c+=($(run cryptblk x $D/img $w)); done
    ma=$(printf '%s\n' "${a[@]}" | sort -n | sed -n 2p); mc=$(printf '%s\n' "${c[@]}" | sort -n | sed -n 2p)
    echo "| $name | $w | $ma (${a[*]}) | $mc (${c[*]}) | $(python3 -c "print('%.1fx'%($mc/$ma))") |"
  done
done
