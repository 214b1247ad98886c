#!/usr/bin/env bash
# A/B of NBD servers on one fio workload: every server in each round, ROUNDS rounds, then
# the median MB/s and the median whole-machine busy CPU time per I/O (from /proc/stat, so
# client, server and kernel together: on a CPU-bound machine, the figure that decides).
# Servers listen on $SOCK (default /dev/shm/peer/nbd.sock; run from the image directory).
# usage: [ROUNDS=6] [RT=3] scripts/bench-ab.sh "FIO ARGS" NAME=COMMAND...
# e.g.   cd /dev/shm/peer && ROUNDS=6 bash /path/scripts/bench-ab.sh \
#          "--rw=randwrite --bs=4k --iodepth=16" \
#          "poll=cryptblk open luks1.img pb --nbd unix:/dev/shm/peer/nbd.sock --key-file pw" \
#          "nopoll=cryptblk open luks1.img pb --nbd unix:/dev/shm/peer/nbd.sock --key-file pw --busy-poll 0"
set -euo pipefail
ROUNDS=${ROUNDS:-6}; RT=${RT:-3}; SOCK=${SOCK:-/dev/shm/peer/nbd.sock}
ARGS=$1; shift
OUT=$(mktemp); FIO=$(mktemp); trap 'rm -f "$OUT" "$FIO"' EXIT
busy() { awk '/^cpu / {print $2+$3+$4+$7+$8}' /proc/stat; }
for r in $(seq "$ROUNDS"); do
  for s in "$@"; do
    name=${s%%=*}; cmd=${s#*=}; rm -f "$SOCK"
    $cmd >/dev/null 2>&1 & pid=$!
    for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
    [ -S "$SOCK" ] || { echo "$name: no socket at $SOCK" >&2; kill $pid; exit 1; }
    b0=$(busy)
    # shellcheck disable=SC2086
    fio --name=ab --ioengine=nbd --uri="nbd+unix:///?socket=$SOCK" $ARGS --size=1000M \
      --time_based --runtime="$RT" --output-format=json --output="$FIO" >/dev/null
    b1=$(busy)
    python3 - "$FIO" $((b1 - b0)) "$name" <<'PY' | tee -a "$OUT"
import json, os, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
mbs = (j["read"]["bw"] + j["write"]["bw"]) / 1024
us = int(sys.argv[2]) / os.sysconf("SC_CLK_TCK") * 1e6 / ios
print(f"{sys.argv[3]} {mbs:.0f} {us:.2f}")
PY
    kill $pid 2>/dev/null; wait $pid 2>/dev/null || true
  done
done
python3 - "$OUT" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, mbs, us = line.split()
    d[name].append((float(mbs), float(us)))
print("\n| server | median MB/s | min–max | CPU µs per I/O (median) |\n|---|---|---|---|")
for k, v in d.items():
    m = [x[0] for x in v]
    print(f"| {k} | {statistics.median(m):.0f} | {min(m):.0f}–{max(m):.0f} | {statistics.median(x[1] for x in v):.2f} |")
PY
