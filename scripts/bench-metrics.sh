#!/usr/bin/env bash
# What `open --metrics` costs the data path (its latency timing: two clock reads and a few
# atomics a request): fio over NBD against the same LUKS2 volume served without and with
# --metrics, alternating ROUNDS times; medians and with ÷ without.
#   [ROUNDS=3] scripts/bench-metrics.sh [seconds per job, default 5] [cryptblk binary]
set -euo pipefail
SECS=${1:-5}
B=${2:-target/release/cryptblk}
ROUNDS=${ROUNDS:-3}
W=$(mktemp -d /var/tmp/bench-metrics.XXXXXX)
trap '"$B" close bm --run-dir "$W/run" > /dev/null 2>&1 || true; rm -rf "$W"' EXIT
printf 'bench passphrase' > "$W/key"
truncate -s 1G "$W/v.img"
"$B" format -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$W/key" "$W/v.img"
echo "# CPU:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) CPUs"
run() { # metrics(0|1) rw bs qd -> MB/s
  local extra=()
  [ "$1" = 1 ] && extra=(--metrics "unix:$W/m.sock")
  "$B" open "$W/v.img" bm --nbd "unix:$W/s.sock" --daemon --run-dir "$W/run" --key-file "$W/key" "${extra[@]}" > /dev/null
  fio --name=b --ioengine=nbd --uri="nbd+unix:///bm?socket=$W/s.sock" --rw="$2" --bs="$3" --iodepth="$4" \
    --size=512M --time_based --runtime="$SECS" --output-format=json 2> /dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round((j["read"]["bw_bytes"]+j["write"]["bw_bytes"])/1e6))'
  "$B" close bm --run-dir "$W/run" > /dev/null
}
echo "| job | without --metrics MB/s | with MB/s | with ÷ without |"
echo "|---|---|---|---|"
for job in "randread 4k 16" "randwrite 4k 16" "read 128k 8" "write 128k 8"; do
  set -- $job
  a=() b=()
  for _ in $(seq "$ROUNDS"); do a+=("$(run 0 "$@")"); b+=("$(run 1 "$@")"); done
  python3 - "$*" "${a[*]}" "${b[*]}" << 'PY'
import statistics, sys
job, a, b = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"| {job} | {ma:.0f} | {mb:.0f} | {mb/ma:.2f} |")
PY
done
