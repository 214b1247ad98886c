#!/usr/bin/env bash
# fio over NBD (unix socket) against cryptblk with each file I/O engine — auto, pread/pwrite,
# io_uring or mmap, page cache or O_DIRECT — and with cipher_null, on one image, in one run.
# usage: scripts/bench-io.sh [runtime_s] [dir]   (dir: where the image lives; default
# /var/tmp, a disk; /dev/shm for tmpfs). Prints MB/s (read+write) per variant and workload.
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-5}; DIR=${2:-/var/tmp}
B=$PWD/target/release/cryptblk
[ -x "$B" ] || cargo build --release -p cryptblk
W=$(mktemp -d "$DIR/cryptblk-io.XXXXXX"); trap 'rm -rf "$W"' EXIT
printf pw > "$W/pw"
truncate -s 1100M "$W/luks.img"
"$B" format -q --type luks1 --cipher aes-xts-plain64 --key-size 512 --pbkdf pbkdf2 \
  --pbkdf-force-iterations 1000 --key-file "$W/pw" "$W/luks.img"
# The data area filled once, so reads hit allocated blocks.
"$B" import --key-file "$W/pw" "$W/luks.img" <(head -c 1000M /dev/zero) >/dev/null 2>&1 || true
head -c 32 /dev/urandom > "$W/null.key"
VARIANTS=(
  "auto=--io-engine auto"
  "psync=--io-engine psync"
  "mmap=--io-engine mmap"
  "io_uring=--io-engine io_uring"
  "psync+direct=--io-engine psync --direct-io"
  "io_uring+direct=--io-engine io_uring --direct-io"
  "cipher_null(psync)=--type plain --cipher cipher_null-ecb --key-size 256 --offset 4096"
)
WL=("4k-rw-qd1:--rw=readwrite --bs=4k --iodepth=1"
    "4k-randread-qd16:--rw=randread --bs=4k --iodepth=16"
    "4k-randwrite-qd16:--rw=randwrite --bs=4k --iodepth=16"
    "128k-read-qd8:--rw=read --bs=128k --iodepth=8"
    "128k-write-qd8:--rw=write --bs=128k --iodepth=8")
echo "image in $DIR ($(df -T "$DIR" | awk 'NR==2{print $2}')), ${RT}s per run, MB/s"
printf "%-20s" variant; for w in "${WL[@]}"; do printf "%19s" "${w%%:*}"; done; echo
for v in "${VARIANTS[@]}"; do
  name=${v%%=*}; opts=${v#*=}
  keyfile=$W/pw; [[ $name == cipher_null* ]] && keyfile=$W/null.key
  # shellcheck disable=SC2086
  if ! "$B" open "$W/luks.img" v --nbd "unix:$W/s.sock" --run-dir "$W/run" --daemon \
      --key-file "$keyfile" $opts >/dev/null 2>"$W/err"; then
    printf "%-20s %s\n" "$name" "not available: $(tail -1 "$W/err")"; continue
  fi
  printf "%-20s" "$name"
  for w in "${WL[@]}"; do
    # shellcheck disable=SC2086
    fio --name=x --ioengine=nbd --uri="nbd+unix:///v?socket=$W/s.sock" ${w#*:} --size=1000M \
      --time_based --runtime="$RT" --output-format=json --output="$W/fio.json" >/dev/null 2>&1
    printf "%19s" "$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print("%.0f"%((j["read"]["bw"]+j["write"]["bw"])/1024))' "$W/fio.json")"
  done; echo
  "$B" close v --run-dir "$W/run"
done
