#!/usr/bin/env bash
# The RBD backend's speed bars (issue 15), on a throwaway single-node memstore cluster
# (tests/ceph/cluster.sh): 4 MiB and 4 KiB random writes and reads at queue depth 32 (the
# Ceph LUKS study's workloads), MB/s, alternating, ROUNDS times:
#   librbd          fio's rbd engine on an unencrypted image (librbd in fio's process)
#   cryptblk        fio's nbd engine against cryptblk serving rbd:rbd/enc (LUKS2, its own
#                   engine; the data path crosses NBD on a unix socket too)
#   py-librbd       a python3-rbd client (aio, QD 32) on the unencrypted image, and
#   py-librbd-luks2 the same client on an image librbd formatted and loads with its own
#                   LUKS2 encryption (fio's rbd engine cannot load encryption, and this
#                   Ceph's `rbd bench` has no --encryption-format)
# CLUSTER_CPUS and CLIENT_CPUS (taskset lists) put the cluster (monitor and OSD) and the
# clients (fio, cryptblk, python3-rbd) on CPUs of their own, as if on two hosts.
# usage: [ROUNDS=3] scripts/bench-rbd.sh [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-5}; ROUNDS=${ROUNDS:-3}
B=$PWD/target/release/cryptblk
[ -x "$B" ] || cargo build --release -p cryptblk >/dev/null
W=$(mktemp -d /dev/shm/cryptblk-rbd.XXXXXX)
CONF=$(CEPH_MEMSTORE_BYTES=$((8 << 30)) ${CLUSTER_CPUS:+taskset -c $CLUSTER_CPUS} \
  bash tests/ceph/cluster.sh start "$W/ceph")
export CEPH_CONF=$CONF
# The server closes its image (and lock) on the way out: stop it before the cluster.
cleanup() {
  [ -z "${SERVER:-}" ] || { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }
  bash tests/ceph/cluster.sh stop "$W/ceph"; rm -rf "$W"
}
trap cleanup EXIT
printf 'rbd bench pass' > "$W/pw"
SIZE=1024
PIN=${CLIENT_CPUS:+taskset -c $CLIENT_CPUS}
PY="$PIN /usr/bin/python3"
FIO_BIN=$(command -v fio)
fio() { $PIN "$FIO_BIN" "$@"; }
$PY - "$CONF" "$W/pw" "$SIZE" <<'PY'
import rados, rbd, sys
conf, pw, size = sys.argv[1], open(sys.argv[2], 'rb').read(), int(sys.argv[3]) << 20
c = rados.Rados(conffile=conf); c.connect()
io = c.open_ioctx('rbd')
for name in ('raw', 'enc', 'lib'):
    rbd.RBD().create(io, name, size + (16 << 20))
with rbd.Image(io, 'lib') as img:
    img.encryption_format(rbd.RBD_ENCRYPTION_FORMAT_LUKS2, pw)
io.close(); c.shutdown()
PY
"$B" format -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$W/pw" rbd:rbd/enc
# Every image written in full first (reads of never-written objects cost nothing).
fio --name=fill --ioengine=rbd --pool=rbd --rbdname=raw --clientname=admin --rw=write --bs=4M \
  --iodepth=16 --size=${SIZE}M > /dev/null
$PIN "$B" open rbd:rbd/enc pb --nbd "unix:$W/nbd.sock" --run-dir "$W/run" --key-file "$W/pw" > /dev/null 2>&1 &
SERVER=$!
for _ in $(seq 100); do [ -S "$W/nbd.sock" ] && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri="nbd+unix:///pb?socket=$W/nbd.sock" --rw=write --bs=4M \
  --iodepth=16 --size=${SIZE}M > /dev/null

pyclient() { # image luks(0|1) rw bs
  $PY - "$CONF" "$W/pw" "$1" "$2" "$3" "$4" "$RT" "$SIZE" <<'PY'
import rados, rbd, sys, os, time, threading, random
conf, pw, name, luks, rw, bs, secs, size = sys.argv[1:9]
bs, secs, size = int(bs), float(secs), int(size) << 20
c = rados.Rados(conffile=conf); c.connect()
io = c.open_ioctx('rbd')
img = rbd.Image(io, name)
if luks == '1':
    img.encryption_load(rbd.RBD_ENCRYPTION_FORMAT_LUKS2, open(pw, 'rb').read())
data = os.urandom(bs)
slots = threading.Semaphore(32)
lock = threading.Lock(); done = [0]; failed = [0]
def cb(comp, *a):
    with lock:
        if comp.get_return_value() < 0: failed[0] += 1
        else: done[0] += 1
    slots.release()
blocks = (min(size, img.size()) // bs)
end = time.time() + secs
t0 = time.time(); sent = 0
while time.time() < end:
    slots.acquire()
    off = random.randrange(blocks) * bs
    if rw == 'read':
        img.aio_read(off, bs, cb)
    else:
        img.aio_write(data, off, cb)
    sent += 1
for _ in range(32): slots.acquire()
t = time.time() - t0
if failed[0]: sys.exit("%d requests failed" % failed[0])
print("%.0f" % (done[0] * bs / t / 1048576))
img.close(); io.close(); c.shutdown()
PY
}
if true; then # librbd's LUKS2 image written in full once, through its own encryption
  $PY - "$CONF" "$W/pw" "$SIZE" <<'PY'
import rados, rbd, sys
conf, pw, size = sys.argv[1], open(sys.argv[2], 'rb').read(), int(sys.argv[3]) << 20
c = rados.Rados(conffile=conf); c.connect(); io = c.open_ioctx('rbd')
with rbd.Image(io, 'lib') as img:
    img.encryption_load(rbd.RBD_ENCRYPTION_FORMAT_LUKS2, pw)
    chunk = b'\0' * (4 << 20)
    for off in range(0, min(size, img.size()) - (4 << 20) + 1, 4 << 20):
        img.write(chunk, off)
io.close(); c.shutdown()
PY
fi
mbps() { python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print("%.0f" % ((j["read"]["bw"]+j["write"]["bw"])/1024))'; }
OUT=$W/out
WL=("4m-randwrite write 4194304" "4m-randread read 4194304" "4k-randwrite write 4096" "4k-randread read 4096")
printf '%-18s' server; for w in "${WL[@]}"; do printf '%16s' "${w%% *}"; done; echo
for r in $(seq "$ROUNDS"); do
  for s in librbd cryptblk py-librbd py-librbd-luks2; do
    printf '%-18s' "$s"
    for w in "${WL[@]}"; do
      read -r name rw bs <<< "$w"
      case $s in
        librbd) v=$(fio --name=b --ioengine=rbd --pool=rbd --rbdname=raw --clientname=admin \
                  --rw=rand$rw --bs=$bs --iodepth=32 --size=${SIZE}M --time_based --runtime=$RT \
                  --output-format=json 2>/dev/null | mbps) ;;
        cryptblk) v=$(fio --name=b --ioengine=nbd --uri="nbd+unix:///pb?socket=$W/nbd.sock" \
                  --rw=rand$rw --bs=$bs --iodepth=32 --size=${SIZE}M --time_based --runtime=$RT \
                  --output-format=json 2>/dev/null | mbps) ;;
        py-librbd) v=$(pyclient raw 0 $rw $bs) ;;
        py-librbd-luks2) v=$(pyclient lib 1 $rw $bs) ;;
      esac
      printf '%16s' "$v"
    done
    echo
  done | tee -a "$OUT"
done
python3 - "$OUT" <<'PY'
import sys, statistics
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5:
        runs.setdefault(f[0], []).append([float(x) for x in f[1:]])
rows = {k: [statistics.median(c) for c in zip(*v)] for k, v in runs.items()}
wl = ["4m-randwrite", "4m-randread", "4k-randwrite", "4k-randread"]
print("\n| client (median MB/s, QD 32) | " + " | ".join(wl) + " |")
print("|---" * 5 + "|")
for k, v in rows.items():
    print(f"| {k} | " + " | ".join(f"{x:.0f}" for x in v) + " |")
def ratio(a, b): return " | ".join(f"{x / y:.2f}" if y else "-" for x, y in zip(rows[a], rows[b]))
print(f"| cryptblk ÷ librbd (fio, unencrypted; bar ≥ 0.9) | {ratio('cryptblk', 'librbd')} |")
print(f"| cryptblk ÷ librbd LUKS2 (python client; bar ≥ 1.5) | {ratio('cryptblk', 'py-librbd-luks2')} |")
print(f"| python client: LUKS2 ÷ unencrypted | {ratio('py-librbd-luks2', 'py-librbd')} |")
PY
