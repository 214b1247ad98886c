#!/usr/bin/env bash
# The RBD backend's speed bars (issue 15), on a throwaway single-node memstore cluster
# (tests/ceph/cluster.sh): 4 MiB and 4 KiB random writes and reads at queue depth 32 (the
# Ceph LUKS study's workloads), MiB/s, alternating, ROUNDS times:
#   librbd          fio's rbd engine on an unencrypted image (librbd in fio's process)
#   cryptblk        fio's nbd engine against cryptblk serving rbd:rbd/enc (LUKS2, its own
#                   engine; the data path crosses NBD on a unix socket too)
#   librbd-client   crates/rbd/examples/rbd_load.rs: QD 32 threads, each waiting on
#                   librbd's aio as cryptblk's threads do, on the unencrypted image, and
#   librbd-luks2    the same client on an image librbd formatted and loads with its own
#                   LUKS2 encryption (fio's rbd engine cannot load encryption, and this
#                   Ceph's `rbd bench` has no --encryption-format)
# CLUSTER_CPUS and CLIENT_CPUS (taskset lists) put the cluster (monitor and OSD) and the
# clients (fio, cryptblk, rbd_load) on CPUs of their own, as if on two hosts.
# Needs no Python bindings of Ceph: the tools, librbd and python3 only.
# CRYPTBLK_BIN and RBD_LOAD_BIN pick other builds (default: target/release); CRYPTBLK_ARGS
# adds options to the cryptblk server.
# usage: [ROUNDS=3] scripts/bench-rbd.sh [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-5}; ROUNDS=${ROUNDS:-3}
B=${CRYPTBLK_BIN:-$PWD/target/release/cryptblk}
L=${RBD_LOAD_BIN:-$PWD/target/release/examples/rbd_load}
[ -x "$B" ] || cargo build --release -p cryptblk >/dev/null
[ -x "$L" ] || cargo build --release -p cryptblk-rbd --example rbd_load >/dev/null
W=$(mktemp -d /dev/shm/cryptblk-rbd.XXXXXX)
# The server closes its image (and lock) on the way out: stop it before the cluster (which
# is stopped even if it did not come up all the way).
cleanup() {
  [ -z "${SERVER:-}" ] || { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }
  bash tests/ceph/cluster.sh stop "$W/ceph"; rm -rf "$W"
}
trap cleanup EXIT
CONF=$(CEPH_MEMSTORE_BYTES=$((8 << 30)) ${CLUSTER_CPUS:+taskset -c $CLUSTER_CPUS} \
  bash tests/ceph/cluster.sh start "$W/ceph")
export CEPH_CONF=$CONF
printf 'rbd bench pass' > "$W/pw"
SIZE=1024
PIN=${CLIENT_CPUS:+taskset -c $CLIENT_CPUS}
FIO_BIN=$(command -v fio)
fio() { $PIN "$FIO_BIN" "$@"; }
load() { $PIN "$L" --conf "$CONF" "$@"; }
for name in raw enc lib; do rbd -c "$CONF" create --size $((SIZE + 16)) "rbd/$name"; done
load rbd/lib --luks2 "$W/pw" format-luks2
"$B" format -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$W/pw" rbd:rbd/enc
# Every image written in full first (reads of never-written objects cost nothing).
fio --name=fill --ioengine=rbd --pool=rbd --rbdname=raw --clientname=admin --rw=write --bs=4M \
  --iodepth=16 --size=${SIZE}M > /dev/null
$PIN "$B" open rbd:rbd/enc pb --nbd "unix:$W/nbd.sock" --run-dir "$W/run" --key-file "$W/pw" ${CRYPTBLK_ARGS:-} > /dev/null 2>&1 &
SERVER=$!
for _ in $(seq 100); do [ -S "$W/nbd.sock" ] && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri="nbd+unix:///pb?socket=$W/nbd.sock" --rw=write --bs=4M \
  --iodepth=16 --size=${SIZE}M > /dev/null

# librbd's LUKS2 image written in full once, through its own encryption.
load rbd/lib --luks2 "$W/pw" fill 0
mbps() { python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print("%.0f" % ((j["read"]["bw"]+j["write"]["bw"])/1024))'; }
OUT=$W/out
WL=("4m-randwrite write 4194304" "4m-randread read 4194304" "4k-randwrite write 4096" "4k-randread read 4096")
printf '%-18s' server; for w in "${WL[@]}"; do printf '%16s' "${w%% *}"; done; echo
for r in $(seq "$ROUNDS"); do
  for s in librbd cryptblk librbd-client librbd-luks2; do
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
        librbd-client) v=$(load rbd/raw run $rw $bs 32 $RT $SIZE) ;;
        librbd-luks2) v=$(load rbd/lib --luks2 "$W/pw" run $rw $bs 32 $RT $SIZE) ;;
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
print("\n| client (median MiB/s, QD 32) | " + " | ".join(wl) + " |")
print("|---" * 5 + "|")
for k, v in rows.items():
    print(f"| {k} | " + " | ".join(f"{x:.0f}" for x in v) + " |")
def ratio(a, b): return " | ".join(f"{x / y:.2f}" if y else "-" for x, y in zip(rows[a], rows[b]))
print(f"| cryptblk ÷ librbd (fio, unencrypted; bar ≥ 0.9) | {ratio('cryptblk', 'librbd')} |")
print(f"| cryptblk ÷ librbd LUKS2 (rbd_load; bar ≥ 1.5) | {ratio('cryptblk', 'librbd-luks2')} |")
print(f"| rbd_load: librbd's LUKS2 ÷ unencrypted | {ratio('librbd-luks2', 'librbd-client')} |")
PY
