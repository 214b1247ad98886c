#!/usr/bin/env bash
# Client throughput over NBD while the served volume is reencrypted online, beside the
# same workload without it, in one run: a LUKS2 image (aes-xts-plain64, 512-bit key,
# 4096-byte sectors) in tmpfs served by `cryptblk open --nbd unix:`; per workload and
# round, fio runs SECS seconds with no job, then SECS seconds while `cryptblk reencrypt`
# (checksum resilience) runs in the serving process (stopped after the window with
# Ctrl-C, resumed in the next; a new job once one finishes). Prints MB/s (read+write) of
# each window, the job's own rate during it, and the median ratio per workload.
# usage: [ROUNDS=3] [SIZE=4G] [SECS=8] [DIR=private dir in /dev/shm]
#        scripts/bench-online-reencrypt.sh [rw:bs:iodepth ...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; SIZE=${SIZE:-4G}; SECS=${SECS:-8}
DIR=${DIR:-$(mktemp -d /dev/shm/cryptblk-online.XXXXXX)}
WORKLOADS=${*:-randrw:4k:16 read:128k:8 write:128k:8}
B=$PWD/target/release/cryptblk
[ -x "$B" ] || cargo build --release -p cryptblk >/dev/null
mkdir -p -m 0700 "$DIR"
cleanup() { "$B" close vol --run-dir "$DIR/run" 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT
(umask 077; printf 'rotate while serving' > "$DIR/pw")
KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
img=$DIR/v.img
fallocate -l "$SIZE" "$img"
"$B" format -q --type luks2 --sector-size 4096 "${KDF[@]}" --key-file "$DIR/pw" "$img"
"$B" open "$img" vol --nbd "unix:$DIR/s.sock" --daemon --run-dir "$DIR/run" --key-file "$DIR/pw" >/dev/null
uri="nbd+unix:///vol?socket=$DIR/s.sock"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; image $SIZE in $DIR"

job_field() { "$B" list --json --run-dir "$DIR/run" | python3 -c "import json,sys; r=json.load(sys.stdin)[0]['reencryption']; print((r or {}).get('$1') or '')"; }
# MB/s (10^6 B/s, read + write) of one fio window.
window() {
  local rw=${1%%:*} rest=${1#*:}; local bs=${rest%%:*} qd=${rest#*:}
  fio --name=w --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" --iodepth="$qd" \
      --size=1G --time_based --runtime="$SECS" --output-format=json --directory="$DIR" 2>/dev/null |
    python3 -c "import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):])['jobs'][0]; print('%.0f' % ((j['read']['bw_bytes']+j['write']['bw_bytes'])/1e6))"
}
out=$(mktemp)
for w in $WORKLOADS; do
  for r in $(seq "$ROUNDS"); do
    base=$(window "$w")
    resume=(); [ "$(job_field state)" = stopped ] && resume=(--resume-only)
    d0=$(job_field done_bytes); [ "${#resume[@]}" -eq 0 ] && d0=0
    "$B" reencrypt -q "$img" "${resume[@]}" "${KDF[@]}" --key-file "$DIR/pw" --run-dir "$DIR/run" 2>/dev/null &
    job=$!
    during=$(window "$w")
    kill -INT "$job" 2>/dev/null || true; wait "$job" || true
    d1=$(job_field done_bytes); state=$(job_field state)
    rate=$(python3 -c "print('%.0f' % ((${d1:-0} - ${d0:-0}) / 1e6 / $SECS))")
    note=""; [ "$state" = finished ] && note=" (job finished inside the window)"
    echo "$w round $r: alone $base MB/s, during reencryption $during MB/s, job ${rate} MB/s$note" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import sys, statistics, re
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) round \d+: alone (\d+) MB/s, during reencryption (\d+) MB/s, job (-?\d+) MB/s", line)
    if m:
        runs.setdefault(m[1], []).append((int(m[2]), int(m[3]), int(m[4])))
print("\n| workload (rw:bs:QD) | alone (median MB/s) | during reencryption | ratio | job during it (MB/s) |")
print("|---|---|---|---|---|")
for w, v in runs.items():
    a = statistics.median(x for x, _, _ in v); d = statistics.median(y for _, y, _ in v)
    j = statistics.median(z for _, _, z in v)
    print(f"| {w} | {a:.0f} | {d:.0f} | {d / a:.2f} | {j:.0f} |")
PY
rm -f "$out"
