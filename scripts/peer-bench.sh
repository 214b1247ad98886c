#!/usr/bin/env bash
# One round of the NBD peer benchmark: fio's nbd engine against each server in turn, all
# serving the same LUKS1 image (aes-xts-plain64, 512-bit key) or a raw image of the same
# size, from tmpfs, on a unix socket. Prints one line per server: MB/s per workload.
#
# usage: scripts/peer-bench.sh [SECONDS] ["name=server command" ...]
# Every server command must serve on the socket $PEER_DIR/nbd.sock; the extra servers
# given here run after the built-in peers (nbdkit file and luks filter, qemu-nbd raw and
# LUKS). PEER_DIR (default /dev/shm/cryptblk-peer) holds luks1.img (passphrase file pw)
# and raw.img, made on first use. On a machine with cores to spare, SERVER_CPUS and
# CLIENT_CPUS (taskset lists, e.g. 4-9 and 0-3) keep the server and fio apart, so neither
# measures the other's CPU.
set -uo pipefail
SECONDS_PER=${1:-8}
shift || true
DIR=${PEER_DIR:-/dev/shm/cryptblk-peer}
mkdir -p "$DIR"
cd "$DIR" || exit 1
SOCK=$DIR/nbd.sock
# Both images are written in full once: every server then reads allocated pages (a hole
# reads faster than data, and cryptblk reads holes of a tmpfs image with pread).
if [ ! -f luks1.img ]; then
  printf pass > pw
  head -c 1100M /dev/zero > luks1.img
  if command -v cryptsetup >/dev/null; then
    cryptsetup luksFormat -q --type luks1 --cipher aes-xts-plain64 --key-size 512 \
      --pbkdf-force-iterations 1000 --key-file pw luks1.img || exit 1
  else # the same header from cryptblk, where cryptsetup is not installed
    "${CRYPTBLK_BIN:?no cryptsetup here: set CRYPTBLK_BIN}" format -q --type luks1 \
      --cipher aes-xts-plain64 --key-size 512 --pbkdf-force-iterations 1000 \
      --key-file pw luks1.img || exit 1
  fi
fi
[ -f raw.img ] || head -c 1024M /dev/zero > raw.img

# NO_BUILTIN_PEERS=1: only the servers given as arguments. ONLY="NAME...": only those.
peers=(
  "nbdkit-raw=nbdkit -f -U $SOCK file raw.img"
  "nbdkit-luks=nbdkit -f -U $SOCK --filter=luks file luks1.img passphrase=pass"
  "qemu-nbd-raw=qemu-nbd -f raw -k $SOCK -t --cache=none --aio=threads raw.img"
  "qemu-nbd-luks=qemu-nbd -k $SOCK -t --cache=writeback --object secret,id=s0,data=pass --image-opts driver=luks,key-secret=s0,file.filename=luks1.img"
  "$@"
)
[ -z "${NO_BUILTIN_PEERS:-}" ] || peers=("$@")
workloads=(
  "4k-rw-qd1 --rw=readwrite --bs=4k --iodepth=1"
  "4k-randread-qd16 --rw=randread --bs=4k --iodepth=16"
  "4k-randwrite-qd16 --rw=randwrite --bs=4k --iodepth=16"
  "128k-read-qd8 --rw=read --bs=128k --iodepth=8"
  "128k-write-qd8 --rw=write --bs=128k --iodepth=8"
)

# MB/s (reads and writes together) from fio's JSON on stdin (fio's nbd engine may print a
# "connected to NBD server" line before it).
mbps() {
  python3 -c 'import json, sys
text = sys.stdin.read()
job = json.loads(text[text.index("{"):])["jobs"][0]
print("%.0f" % ((job["read"]["bw"] + job["write"]["bw"]) / 1024))' 2> /dev/null || echo ERR
}

printf '%-16s' server
for w in "${workloads[@]}"; do printf '%20s' "${w%% *}"; done
echo
for entry in "${peers[@]}"; do
  [ -n "$entry" ] || continue
  name=${entry%%=*}
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || continue
  rm -f "$SOCK"
  # The command is a word list on purpose (options with spaces are not needed).
  ${SERVER_CPUS:+taskset -c $SERVER_CPUS} ${entry#*=} > /dev/null 2> "$DIR/$name.err" &
  server=$!
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
  printf '%-16s' "$name"
  for w in "${workloads[@]}"; do
    read -r -a opts <<< "${w#* }"
    ${CLIENT_CPUS:+taskset -c $CLIENT_CPUS} fio --name=peer --ioengine=nbd --uri="nbd+unix:///?socket=$SOCK" "${opts[@]}" \
      --size=1000M --time_based --runtime="$SECONDS_PER" --output-format=json 2> /dev/null |
      mbps | xargs printf '%20s'
  done
  echo
  kill "$server" 2> /dev/null
  wait "$server" 2> /dev/null
done
